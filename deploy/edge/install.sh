#!/bin/sh
# Installs the shorelink edge agent from the bundle this script is in, with no network:
# made by `shorelink-edge bundle` (docs/edge-agent.md, "Installing a ship from a
# bundle"). Run as root on the ship, from anywhere:
#
#   tar -xf ship.tar && sudo ./shorelink-edge-*/install.sh
#
# What it does, in order; it stops at the first thing that fails:
#   1. checks every file of the bundle against SHA256SUMS (and that no other is there);
#   2. checks this machine's architecture and Python against the bundle's;
#   3. makes the virtualenv /opt/shorelink/.venv (if missing) and installs the pinned
#      wheels of requirements.txt into it from wheels/ (pip --no-index: no network);
#      run again with a newer or an older bundle, it moves to that bundle's versions;
#   4. the system user `shorelink` (sysusers.d, or useradd where systemd is absent);
#   5. /etc/shorelink (root:shorelink 0750) with edge.toml.sample, and edge.toml from it
#      if there is none (an existing edge.toml is never touched); /var/lib/shorelink
#      (shorelink 0700: the unit's StateDirectory=, made here too for a run by hand);
#   6. the unit /etc/systemd/system/shorelink-edge.service and, under a running systemd,
#      daemon-reload. It enables and starts nothing: edit edge.toml first.
# Environment: PYTHON, the interpreter for the virtualenv (default: python<X.Y> of the
# bundle, else python3).
set -eu

die() { echo "install.sh: error: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
cd "$HERE"
[ "$(id -u)" = 0 ] || die "run as root (it installs under /opt and /etc)"

# 1. every file as the bundle was made, and nothing else
[ -f SHA256SUMS ] || die "no SHA256SUMS beside install.sh: not a whole bundle"
sha256sum --check --strict --quiet SHA256SUMS || die "a file of the bundle differs from SHA256SUMS (above): copy the bundle again"
listed=$(awk '{ sub(/^\*/, "", $2); print $2 }' SHA256SUMS | sort)
present=$(find . -type f ! -path ./SHA256SUMS | sed 's|^\./||' | sort)
[ "$listed" = "$present" ] || die "files not in SHA256SUMS: $(echo "$present" | grep -vxF "$listed" | tr '\n' ' ')"
say "bundle verified: $(wc -l < SHA256SUMS) files"

# 2. the machine and the Python the wheels were chosen for
field() { sed -n "s/^$1=//p" bundle.env; }
VERSION=$(field version)
MACHINE=$(field machine)
PYVER=$(field python)
[ "$(uname -m)" = "$MACHINE" ] || die "this bundle is for $MACHINE, this machine is $(uname -m): make one with shorelink-edge bundle --arch $(uname -m)"
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    command -v "python$PYVER" >/dev/null 2>&1 && PYTHON="python$PYVER"
fi
have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "no Python at $PYTHON"
[ "$have" = "$PYVER" ] || die "this bundle is for Python $PYVER, $PYTHON is $have: set PYTHON, or make one with shorelink-edge bundle --python $have"

# 3. the virtualenv, from the bundle's wheels only (pip runs from its own wheel: the
# system's ensurepip, python3-venv on Debian, is not needed)
VENV=/opt/shorelink/.venv
PIP_WHEEL=$(ls wheels/pip-*.whl | head -n 1)
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --without-pip "$VENV" || die "could not make $VENV"
fi
"$VENV/bin/python" "$PIP_WHEEL/pip" install --quiet --no-index --find-links "$HERE/wheels" \
    --disable-pip-version-check --no-cache-dir --requirement requirements.txt \
    || die "pip could not install the bundle's wheels into $VENV"
say "installed shorelink $VERSION in $VENV: $("$VENV/bin/shorelink-edge" --version)"

# 4. the agent's user and group
mkdir -p /etc/sysusers.d
install -m 0644 shorelink.sysusers /etc/sysusers.d/shorelink.conf
if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers /etc/sysusers.d/shorelink.conf
elif ! getent passwd shorelink >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/shorelink --no-create-home \
        --shell /usr/sbin/nologin --comment "shorelink edge agent" shorelink
fi
getent passwd shorelink >/dev/null || die "no user shorelink after sysusers"

# 5. configuration and state
install -d -m 0750 -o root -g shorelink /etc/shorelink
install -m 0640 -o root -g shorelink edge.toml /etc/shorelink/edge.toml.sample
if [ ! -e /etc/shorelink/edge.toml ]; then
    install -m 0640 -o root -g shorelink edge.toml /etc/shorelink/edge.toml
    say "wrote /etc/shorelink/edge.toml from the sample: set ship, mqtt and the gateways"
fi
install -d -m 0700 -o shorelink -g shorelink /var/lib/shorelink

# 6. the unit
install -D -m 0644 shorelink-edge.service /etc/systemd/system/shorelink-edge.service
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload
    if systemctl is-active --quiet shorelink-edge; then
        say "the agent is running the version it started with: systemctl restart shorelink-edge"
    fi
fi
say "next: secrets in /etc/shorelink/edge.env (0600), then"
say "  $VENV/bin/shorelink-edge check-config /etc/shorelink/edge.toml"
say "  systemctl enable --now shorelink-edge"
