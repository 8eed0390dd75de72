#!/usr/bin/env bash
# Set up Ray Serve in its own venv (.cache/ray-venv, git-ignored), kept apart from the project's
# .venv: ray[serve] pins its own pydantic, protobuf, grpcio... and must not steer ours.
#
#   scripts/setup_ray.sh            # idempotent: a finished install is kept (stamp file)
#
# Installs this package, editable, with its dev and ray extras (pyproject.toml pins
# ray[serve]==2.60.0). The stamp names a hash of pyproject.toml and of this checkout's path:
# a change to the dependencies reinstalls, and so does another clone reusing a cached venv (CI
# links .cache/ to a per-machine folder), whose editable install must point at its own src/.
# A change to our code needs nothing (editable). Any failure prints which step failed and
# exits non-zero. Measured: 70 s from nothing on this machine's PyPI mirror, then 0 s. No
# byte-compiling at install (--no-compile, as make install): Python compiles what Ray imports.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${RAY_VENV:-.cache/ray-venv}
PY=${PY:-python3}
STAMP="$VENV/.installed-$( (pwd; cat pyproject.toml) | sha256sum | cut -c1-12)"

NAME=setup_ray
# shellcheck source=scripts/_venv.sh
source scripts/_venv.sh
exit_if_installed
make_venv

step "pip install -e '.[dev,ray]'"
pip_ install --quiet --no-compile -e '.[dev,ray]' || fail "pip install -e '.[dev,ray]' (see the pip output above)"

step "checking the install"
"$VENV/bin/python" -W ignore - <<'PY' || fail "ray or prefixroute.ray_serve does not import in $VENV"
import importlib.metadata as md
import prefixroute.ray_serve  # noqa: F401
print(f"setup_ray: ray {md.version('ray')}")
PY

rm -f "$VENV"/.installed-*
finish
