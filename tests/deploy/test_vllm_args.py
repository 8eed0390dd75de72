"""The vLLM container's command line, parsed by vLLM's own ``vllm serve`` argument parser.

Runs where ``make test-vllm`` has installed vLLM (``.cache/vllm-venv``, the version the
manifest's image tag names); skips elsewhere. It builds the parser as ``vllm serve`` does
(``make_arg_parser``) and parses the manifest's arguments, so a flag vLLM does not have, or a
value it refuses, fails here. Nothing is started (one process, about 7 s: vLLM's imports).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from .manifests import KUBE, ROOT, by_kind, load

VLLM_PYTHON = ROOT / ".cache" / "vllm-venv" / "bin" / "python"
PARSE = """
import contextlib, io, json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
import vllm.version
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    except SystemExit:
        out.append({"error": err.getvalue()})
        continue
    out.append({"version": vllm.version.__version__, "model_tag": a.model_tag, "host": a.host,
                "port": a.port, "prefix": a.enable_prefix_caching,
                "details": a.enable_prompt_tokens_details})
print(json.dumps(out))
"""


def parse(*argvs: list[str]) -> list[dict[str, Any]]:
    """Each command line as vLLM parses it, or ``{"error": ...}``: one process for all
    (vLLM's imports take seconds)."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vLLM here: `make test-vllm` installs it in .cache/vllm-venv")
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", PARSE, json.dumps(argvs)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    parsed: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return parsed


def test_vllm_parses_the_manifests_arguments() -> None:
    statefulset = by_kind(load(KUBE / "base" / "vllm" / "vllm.yaml"), "StatefulSet")["vllm"]
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    # `vllm serve MODEL ...`: the positional model_tag, which `vllm serve` makes args.model.
    args = container["args"]
    parsed, misspelt = parse(args, [args[0], "--enable-prefix-cache"])
    assert parsed["model_tag"] == args[0] == "Qwen/Qwen3-8B"
    assert (parsed["host"], parsed["port"]) == ("0.0.0.0", container["ports"][0]["containerPort"])
    assert parsed["prefix"] is True and parsed["details"] is True
    assert container["image"].endswith(f":v{parsed['version']}")
    assert "unrecognized arguments: --enable-prefix-cache" in misspelt["error"]
