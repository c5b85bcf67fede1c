#!/usr/bin/env bash
# Make a gateway's TLS files with a CA of your own (when a public CA's certificate is not
# what your ships use): docs/gateway-api.md, "TLS".
#
#   deploy/gateway/make-tls.sh HOST [DIR]
#
# HOST: the name ships reach the gateway by (the host of their gateway URL); an IP
# address works too. DIR (default ./tls) gets:
#   ca.crt       the CA's certificate: each ship's gateway entry names it as ca_file
#   ca.key       the CA's key (mode 0600): keep it offline, it signs the next certificate
#   gateway.crt  the gateway's certificate (listen.tls_cert_file), valid 825 days
#   gateway.key  its key (mode 0600; listen.tls_key_file)
# A CA already in DIR is used again, so a renewed certificate needs no change on ships.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
host=$1
dir=${2:-tls}
mkdir -p "$dir"
umask 077
if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then san="IP:$host"; else san="DNS:$host"; fi
if [ ! -f "$dir/ca.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=shorelink gateway CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$host" \
  -keyout "$dir/gateway.key" -out "$dir/gateway.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > "$dir/gateway.ext"
openssl x509 -req -in "$dir/gateway.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -days 825 -extfile "$dir/gateway.ext" -out "$dir/gateway.crt" 2>/dev/null
rm -f "$dir/gateway.csr" "$dir/gateway.ext"
chmod 0644 "$dir/ca.crt" "$dir/gateway.crt"
echo "made $dir/gateway.crt for $host (signed by $dir/ca.crt) and $dir/gateway.key" >&2
