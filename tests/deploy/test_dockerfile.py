"""deploy/docker/Dockerfile, read and half run (there is no Docker engine here).

The file is parsed into (instruction, arguments) per stage and checked: two stages, a
compiler in the builder only, the runtime stage copies nothing but the builder's wheels and
runs as a non-root user, the entry point is the package's console script, and the exposed
ports are the CLI's defaults. Then the builder's steps are run: the files it copies (as
.dockerignore lets them through) are put in a temp dir, ``pip wheel`` builds the wheel from
them, and the builder's own ``python -c`` check runs on it (it must pass, and must fail on a
wheel without the compiled modules). The apt-get, useradd and runtime pip lines are not run.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from prefixroute.epp import EppConfig
from prefixroute.gateway import GatewayConfig

from .manifests import ROOT

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    base: str
    name: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def args(self, instruction: str) -> list[str]:
        return [rest for ins, rest in self.steps if ins == instruction]


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile: comments dropped, backslash continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if not pending and raw.lstrip().startswith("#"):
            continue
        if raw.endswith("\\"):
            pending += raw[:-1]
            continue
        if (pending + raw).strip():
            lines.append(pending + raw)
        pending = ""
    stages: list[Stage] = []
    for line in lines:
        instruction, _, rest = line.strip().partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if instruction == "FROM":
            base, _, name = rest.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None))
        elif stages:
            stages[-1].steps.append((instruction, rest))
    return stages


@pytest.fixture
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())


def test_two_stages_a_compiler_only_in_the_builder(stages: list[Stage]) -> None:
    assert [s.name for s in stages] == ["builder", "runtime"]
    builder, runtime = stages
    assert builder.base == runtime.base == "python:${PYTHON_VERSION}-slim"
    assert any("gcc" in run for run in builder.args("RUN"))
    assert not any("gcc" in run or "apt-get" in run for run in runtime.args("RUN"))
    assert any(run.startswith("pip wheel") for run in builder.args("RUN"))


def test_the_runtime_stage_gets_only_the_wheel_and_runs_as_nobody(stages: list[Stage]) -> None:
    runtime = stages[-1]
    assert runtime.args("ADD") == []
    assert runtime.args("COPY") == ["--from=builder /wheels /tmp/wheels"]
    user = runtime.args("USER")[-1].split(":")[0]
    assert user not in ("root", "0") and int(user) >= 1000
    assert any("useradd" in run and f"--uid {user}" in run for run in runtime.args("RUN"))


def test_the_entrypoint_is_the_cli_and_the_ports_its_defaults(stages: list[Stage]) -> None:
    runtime = stages[-1]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert json.loads(runtime.args("ENTRYPOINT")[-1]) == ["prefixroute"]
    assert "prefixroute" in scripts
    exposed = {int(p) for line in runtime.args("EXPOSE") for p in line.split()}
    epp = EppConfig()
    assert exposed == {GatewayConfig().port, epp.grpc_port, epp.http_port}


def test_the_parser_reads_stages_and_continuations() -> None:
    text = "# c\nFROM a AS one\nRUN x \\\n  y\n\nFROM b\nUSER 0\n"
    one, two = parse(text)
    assert (one.base, one.name, one.steps) == ("a", "one", [("RUN", "x   y")])
    assert (two.base, two.name, two.args("USER")) == ("b", None, ["0"])


def build_context(stage: Stage, dest: Path) -> list[str]:
    """Copy what the stage's COPY lines take from the context, .dockerignore applied."""
    ignore = [line for line in DOCKERIGNORE.read_text().splitlines()
              if line and not line.startswith("#")]  # fmt: skip
    copied = []
    for line in stage.args("COPY"):
        *sources, _ = line.split()
        for source in sources:
            for path in [ROOT / source, *(ROOT / source).rglob("*")]:
                rel = path.relative_to(ROOT).as_posix()
                if path.is_file() and _included(rel, ignore):
                    target = dest / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
                    copied.append(rel)
    return copied


def _included(rel: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last matching pattern wins; ``!`` lets a path back in."""
    keep = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/")
        matched = fnmatch.fnmatch(rel, body) or fnmatch.fnmatch(rel, body + "/*")
        matched = matched or fnmatch.fnmatch(rel, body.replace("**/", "*/"))
        if matched:
            keep = negated
    return keep


def test_dockerignore_keeps_build_outputs_out() -> None:
    patterns = [line for line in DOCKERIGNORE.read_text().splitlines()
                if line and not line.startswith("#")]  # fmt: skip
    assert _included("src/prefixroute/cli.py", patterns)
    assert _included("pyproject.toml", patterns)
    assert not _included("src/prefixroute/core/_native/_hotpath.cpython-311-x86_64.so", patterns)
    assert not _included("src/prefixroute/__pycache__/cli.cpython-311.pyc", patterns)
    assert not _included(".venv/bin/python", patterns)
    assert not _included("tests/conftest.py", patterns)


def run_wheel_check(stage: Stage, wheels: Path) -> int:
    """The builder's ``RUN python -c "..."`` check, run here on ``wheels`` for /wheels."""
    (run,) = [r for r in stage.args("RUN") if r.startswith("python -c")]
    code = run.removeprefix("python -c").strip().strip('"').replace("/wheels", str(wheels))
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode


def test_the_builder_step_builds_a_wheel_with_the_compiled_modules(
    stages: list[Stage], tmp_path: Path
) -> None:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler: the wheel would be pure Python")
    context = tmp_path / "context"
    copied = build_context(stages[0], context)
    assert not any(p.endswith(".so") or "__pycache__" in p for p in copied)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("prefixroute-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("_hotpath.", "_kvcache."):
        assert any(module in n and n.endswith(".so") for n in names), module
    assert any(n.endswith("gateway/openapi.json") for n in names)  # package data
    assert run_wheel_check(stages[0], wheel.parent) == 0  # the builder's own check passes
    pure = tmp_path / "pure"
    pure.mkdir()
    with zipfile.ZipFile(pure / "prefixroute-0.1.0-py3-none-any.whl", "w") as z:
        z.writestr("prefixroute/__init__.py", "")
    assert run_wheel_check(stages[0], pure) == 1  # and fails a wheel without the C modules
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "prefixroute = prefixroute.cli:main" in scripts
