#!/usr/bin/env bash
# Make a gateway's TLS files with a CA of your own (when a public CA's certificate is not
# what your ships use): docs/gateway-api.md, "TLS".
#
#   deploy/gateway/make-tls.sh HOST [CA_DIR [OUT_DIR]]
#
# HOST: the name ships reach the gateway by (the host of their gateway URL); an IP
# address works too. CA_DIR (default ./ca) keeps the CA; a CA already there is used
# again, so a renewed certificate needs no change on ships:
#   ca.key       the CA's key (mode 0600): it signs the next certificate; keep it off
#                the gateway (better on a machine of its own), never mount CA_DIR
#   ca.crt       the CA's certificate
# OUT_DIR (default ./tls) gets what the gateway mounts, and nothing else:
#   gateway.crt  the gateway's certificate (listen.tls_cert_file), valid 825 days
#   gateway.key  its key (mode 0600; listen.tls_key_file)
#   ca.crt       a copy of the CA's certificate: each ship's gateway entry names it as ca_file
# OUT_DIR may not be CA_DIR, nor inside it, nor hold it.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
host=$1
ca=${2:-ca}
out=${3:-tls}
ca_abs=$(realpath -m "$ca")
out_abs=$(realpath -m "$out")
case "$out_abs/" in "$ca_abs"/*)
  echo "make-tls.sh: OUT_DIR $out is (inside) CA_DIR $ca: the CA's key would go where the gateway mounts" >&2
  exit 2 ;;
esac
case "$ca_abs/" in "$out_abs"/*)
  echo "make-tls.sh: CA_DIR $ca is inside OUT_DIR $out: the CA's key would go where the gateway mounts" >&2
  exit 2 ;;
esac
mkdir -p "$ca" "$out"
umask 077
if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then san="IP:$host"; else san="DNS:$host"; fi
if [ ! -f "$ca/ca.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=shorelink gateway CA" -keyout "$ca/ca.key" -out "$ca/ca.crt" 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$host" \
  -keyout "$out/gateway.key" -out "$out/gateway.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > "$out/gateway.ext"
openssl x509 -req -in "$out/gateway.csr" -CA "$ca/ca.crt" -CAkey "$ca/ca.key" \
  -CAcreateserial -CAserial "$ca/ca.srl" -days 825 -extfile "$out/gateway.ext" \
  -out "$out/gateway.crt" 2>/dev/null
rm -f "$out/gateway.csr" "$out/gateway.ext"
cp "$ca/ca.crt" "$out/ca.crt"
chmod 0644 "$ca/ca.crt" "$out/ca.crt" "$out/gateway.crt"
echo "made $out/gateway.crt for $host (signed by $ca/ca.crt) and $out/gateway.key; the CA's key stays in $ca" >&2
