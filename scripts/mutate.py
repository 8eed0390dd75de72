"""Mutation testing, one module group at a time: ``make mutate`` (docs/mutation.md).

mutmut reads its settings from ``pyproject.toml`` in the folder it runs in and writes its mutants
under ``mutants/`` there. So each group of ``[tool.prefixroute.mutate.GROUP]`` in our
``pyproject.toml`` runs in a folder of its own, ``.cache/mutate/GROUP/``: links to ``src``,
``tests`` and ``../shared``, and a copy of our ``pyproject.toml`` whose ``[tool.mutmut]`` mutates
that group's ``files`` against its ``tests`` only. mutmut keeps its results there: ``--keep``
retests only the functions whose code changed since (it does not notice new tests, so by default
every run starts afresh).

    scripts/mutate.py                      # every group
    scripts/mutate.py policies registry    # some
    scripts/mutate.py --min-score 90       # exit 1 when a group scores below 90 %
                                           # (or below its own min_score in pyproject.toml)
    scripts/mutate.py index --files src/prefixroute/core/_lru.py   # other files, same tests
    scripts/mutate.py --check NAME tests/core/test_policy_pins.py   # those tests, NAME active

The score of a group is killed / (mutants - equivalent), in per cent. Killed includes timeouts.
Equivalent mutants are those named in docs/mutation.md (a line ``- `NAME`: why``); a mutant that
survives and is not named there is listed at the end of the run, with ``mutmut show NAME`` run
in the group's folder to print its diff.

Mutants are made of the Python source, so the tests run with ``PREFIXROUTE_PURE_PYTHON=1``:
the compiled hot path (core/_native) would otherwise answer for the mutated hashing and LRU
code, and every mutant there would survive.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "mutate"
EQUIVALENT_LIST = ROOT / "docs" / "mutation.md"
PURE_PYTHON = {"PREFIXROUTE_PURE_PYTHON": "1"}  # test the Python that is mutated, not the C
KILLED = {1, 3, 36, 37, -24, 24, 152, 255}  # mutmut's exit codes: failed, errored, timed out
NAME = re.compile(r"^- `([^`]+)`")
CHECK_TIMEOUT_S = 120.0  # --check: seconds before a hanging run counts as killed


@dataclass(slots=True)
class Group:
    name: str
    files: list[str]  # globs of source files to mutate, relative to the repository root
    tests: list[str]  # pytest arguments selecting the tests that may kill them
    functions: list[str] = field(default_factory=list)  # mutant name globs; empty: all
    min_score: float = 0.0  # per cent; the run fails below it (a floor that only goes up)


@dataclass(slots=True)
class Score:
    group: str
    total: int
    killed: int
    equivalent: int
    survivors: list[str]
    seconds: float

    @property
    def percent(self) -> float:
        counted = self.total - self.equivalent
        return 100.0 * self.killed / counted if counted else 100.0


def groups(pyproject: dict[str, object]) -> dict[str, Group]:
    table = pyproject["tool"]["prefixroute"]["mutate"]  # type: ignore[index]
    return {name: Group(name, **spec) for name, spec in table.items()}


def equivalent_names() -> set[str]:
    if not EQUIVALENT_LIST.is_file():
        return set()
    lines = EQUIVALENT_LIST.read_text().splitlines()
    return {m.group(1) for line in lines if (m := NAME.match(line))}


def group_pyproject(text: str, base: dict[str, object], group: Group) -> str:
    """Our pyproject.toml with ``[tool.mutmut]`` set to mutate ``group`` only."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]" or line.startswith("[tool.prefixroute.")
        if not skipping:
            kept.append(line)
    settings = dict(base)
    settings["only_mutate"] = group.files
    settings["pytest_add_cli_args_test_selection"] = group.tests
    kept.append("\n[tool.mutmut]")
    kept += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(kept) + "\n"


def prepare(group: Group, text: str, base: dict[str, object]) -> Path:
    folder = WORK / group.name
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (
        ("src", ROOT / "src"),
        ("tests", ROOT / "tests"),
        ("shared", ROOT.parent / "shared"),
    ):
        link = folder / name
        if link.is_symlink() and link.readlink() != target:
            link.unlink()  # a checkout elsewhere (CI's clone): point at this one
        if not link.is_symlink():
            link.symlink_to(target)
    config = folder / "pyproject.toml"
    new = group_pyproject(text, base, group)
    if not config.is_file() or config.read_text() != new:
        config.write_text(new)
    sync_unmutated(group, folder)
    return folder


def sync_unmutated(group: Group, folder: Path) -> None:
    """Refresh the copies of the files this group does not mutate.

    mutmut copies ``src`` into ``mutants/`` once and regenerates only the files it mutates when
    they change; a later run would test the mutants against stale copies of everything else
    (a changed ``core/load.py`` under the policies group, say). So those copies are brought in
    line with ``src`` before every run, and copies of deleted files are removed.
    """
    copy = folder / "mutants" / "src"
    if not copy.is_dir():
        return  # first run: mutmut copies everything
    src = ROOT / "src"
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if not path.is_file() or "__pycache__" in rel.parts:
            continue
        if any(fnmatch.fnmatch(f"src/{rel}", pattern) for pattern in group.files):
            continue
        target = copy / rel
        if not target.is_file() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    for target in copy.rglob("*.py"):
        rel = target.relative_to(copy)
        if "__pycache__" not in rel.parts and not (src / rel).exists():
            target.unlink()


def score(group: Group, folder: Path, seconds: float, equivalent: set[str]) -> Score:
    total = killed = equiv = 0
    survivors: list[str] = []
    for meta in sorted((folder / "mutants").rglob("*.py.meta")):
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            if group.functions and not any(fnmatch.fnmatch(name, f) for f in group.functions):
                continue
            total += 1
            if code in KILLED:
                killed += 1
            elif name in equivalent:
                equiv += 1
            else:
                survivors.append(name)
    return Score(group.name, total, killed, equiv, survivors, seconds)


def run(group: Group, folder: Path) -> float:
    mutmut = Path(sys.executable).with_name("mutmut")
    start = time.monotonic()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **PURE_PYTHON)
    done = subprocess.run(
        [str(mutmut), "run", *group.functions],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seconds = time.monotonic() - start
    if done.returncode != 0:
        print(done.stdout[-4000:])
        raise SystemExit(f"mutate: mutmut failed on group {group.name} ({done.returncode})")
    return seconds


def check(name: str, tests: list[str]) -> int:
    """Run ``tests`` (from the repository root) with mutant ``name`` active: the mutant applied,
    without touching ``src``. Returns pytest's exit code (non-zero: the tests kill it)."""
    found = [
        meta
        for meta in WORK.glob("*/mutants/**/*.py.meta")
        if name in json.loads(meta.read_text())["exit_code_by_key"]
    ]
    if not found:
        raise SystemExit(f"mutate: no mutant {name} under {WORK}; run its group first")
    folder = WORK / found[0].relative_to(WORK).parts[0]
    env = dict(
        os.environ,
        MUTANT_UNDER_TEST=name,
        PYTHONDONTWRITEBYTECODE="1",
        **PURE_PYTHON,
        PYTHONPATH=str(folder / "mutants" / "src"),
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        code = subprocess.run(cmd, cwd=ROOT, env=env, timeout=CHECK_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        code = 124  # a mutant that hangs the tests is caught too
    print(f"mutate: {name}: {'killed' if code else 'SURVIVED'} by {' '.join(tests)}")
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help="groups to run (default: all)")
    parser.add_argument(
        "--min-score",
        type=float,
        default=0.0,
        help="per cent, every group (each group's own min_score applies too)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep earlier results: retest only functions whose code changed (new or changed "
        "tests are not noticed; without --keep every run starts afresh)",
    )
    parser.add_argument(
        "--report", action="store_true", help="score the results of earlier runs, run nothing"
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        metavar="ARG",
        help="pytest arguments replacing the groups' test selection",
    )
    parser.add_argument(
        "--files",
        nargs="+",
        metavar="GLOB",
        help="files to mutate replacing the groups' own (try a group's new files before "
        "adding them to pyproject.toml)",
    )
    parser.add_argument(
        "--check",
        metavar="MUTANT",
        help="run the tests named in place of groups with MUTANT active",
    )
    args = parser.parse_args()
    if args.check:
        return check(args.check, args.groups)

    text = (ROOT / "pyproject.toml").read_text()
    pyproject = tomllib.loads(text)
    base = pyproject["tool"]["mutmut"]
    table = groups(pyproject)
    unknown = [g for g in args.groups if g not in table]
    if unknown:
        parser.error(f"unknown group(s) {unknown}; groups: {', '.join(table)}")
    equivalent = equivalent_names()
    scores: list[Score] = []
    for name in args.groups or list(table):
        group = table[name]
        if args.tests:
            group.tests = args.tests
        if args.files:
            group.files = args.files
        if args.report:
            scores.append(score(group, WORK / name, 0.0, equivalent))
            continue
        folder = prepare(group, text, base)
        if not args.keep:
            shutil.rmtree(folder / "mutants", ignore_errors=True)
        print(f"mutate: {name} ...", flush=True)
        scores.append(score(group, folder, run(group, folder), equivalent))

    print(
        f"\n{'group':<12} {'mutants':>7} {'killed':>6} {'equiv':>5} {'survived':>8} "
        f"{'score':>6} {'time':>6}"
    )
    for s in scores:
        print(
            f"{s.group:<12} {s.total:>7} {s.killed:>6} {s.equivalent:>5} "
            f"{len(s.survivors):>8} {s.percent:>5.1f}% {s.seconds:>5.0f}s"
        )
    floor = {s.group: max(args.min_score, table[s.group].min_score) for s in scores}
    failed = [s for s in scores if s.percent < floor[s.group]]
    for s in scores:
        for name in s.survivors:
            print(f"survived ({s.group}): {name}")
    if failed:
        below = ", ".join(f"{s.group} {s.percent:.1f}% < {floor[s.group]:g}%" for s in failed)
        print(f"mutate: below the floor: {below}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
