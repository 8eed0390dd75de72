#!/usr/bin/env bash
# Install promtool for the alert rules' tests (deploy/prometheus/, tests/gateway/test_alert_rules.py):
# Debian's prometheus package, downloaded (not installed: no service, no user, no web assets)
# and unpacked into .cache/prometheus/ (git-ignored; CI links .cache to a per-machine folder).
# Its promtool is a static Go binary, linked at .cache/prometheus/promtool.
#
#   scripts/setup_promtool.sh     # idempotent: a finished install is kept while it runs
#
# Needs apt (Debian, Ubuntu). Measured: 3 s from nothing (a 19 MB package), then 0 s.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${PROMTOOL_DIR:-.cache/prometheus}
NAME=setup_promtool
step() { echo "$NAME: $*"; }
fail() { echo "$NAME: FAILED: $*" >&2; exit 1; }

if "$DIR/promtool" --version >/dev/null 2>&1; then
    echo "$NAME: already installed in $DIR (rm -r $DIR to redo)"
    exit 0
fi
command -v apt-get >/dev/null || fail "no apt-get here: install Prometheus's promtool and put it on PATH"
start=$(date +%s)
rm -rf "$DIR"
mkdir -p "$DIR/deb"
# apt-get download writes into the working directory; a missing package list is fetched once.
step "apt-get download prometheus"
if ! (cd "$DIR/deb" && apt-get download -qq prometheus 2>/dev/null); then
    step "apt-get update (no package list yet)"
    apt-get update -qq || fail "apt-get update"
    (cd "$DIR/deb" && apt-get download -qq prometheus) || fail "apt-get download prometheus"
fi
step "unpacking"
dpkg-deb -x "$DIR"/deb/prometheus_*.deb "$DIR/root" || fail "dpkg-deb -x"
ln -sfn root/usr/bin/promtool "$DIR/promtool"
rm -rf "$DIR/deb"
"$DIR/promtool" --version | head -n 1 || fail "$DIR/promtool does not run"
step "done in $(( $(date +%s) - start )) s"
