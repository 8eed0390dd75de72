# Sourced by scripts/setup_{vllm,ray,envoy}.sh: the steps every side venv shares.
#   NAME=setup_x VENV=.cache/x-venv STAMP=$VENV/.installed-v1; source scripts/_venv.sh
#   exit_if_installed; make_venv; ...; finish
# step/fail print under $NAME; pip_ runs the venv's pip, hiding the warning this machine's
# pip.conf causes for each extra index folder it names but lacks.

step() { echo "$NAME: $*"; }
fail() { echo "$NAME: FAILED: $*" >&2; exit 1; }
pip_() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "it is neither a file nor a directory" >&2); }

make_venv() {
    start=$(date +%s)
    step "creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    test -x "$VENV/bin/python" || "${PY:-python3}" -m venv "$VENV" || fail "python -m venv $VENV"
    pip_ install --quiet --upgrade pip || fail "upgrading pip in $VENV"
}

# A finished install (its $STAMP) is kept: say so and exit 0. $1: what is installed, if named.
exit_if_installed() {
    if [[ -f "$STAMP" ]]; then
        echo "$NAME: ${1:+$1 }already installed in $VENV (rm -r $VENV to redo)"
        exit 0
    fi
}

# Mark the install finished and say how long it took since make_venv began.
finish() {
    touch "$STAMP"
    step "done in $(( $(date +%s) - start )) s"
}
