# Sourced by scripts/setup_vllm.sh and scripts/setup_ray.sh: the steps every side venv shares.
#   NAME=setup_x VENV=.cache/x-venv; source scripts/_venv.sh; make_venv
# step/fail print under $NAME; pip_ runs the venv's pip, hiding the warning this machine's
# pip.conf causes for each extra index folder it names but lacks.

step() { echo "$NAME: $*"; }
fail() { echo "$NAME: FAILED: $*" >&2; exit 1; }
pip_() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "it is neither a file nor a directory" >&2); }

make_venv() {
    step "creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    test -x "$VENV/bin/python" || "${PY:-python3}" -m venv "$VENV" || fail "python -m venv $VENV"
    pip_ install --quiet --upgrade pip || fail "upgrading pip in $VENV"
}
