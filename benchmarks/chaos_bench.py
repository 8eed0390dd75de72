"""Chaos and abuse, full size: ``.venv/bin/python benchmarks/chaos_bench.py [--duration 90]
[--scenario all|kill|freeze|poison|paths|slow_readers|shutdown] [--out FILE]``
(about 3 minutes with the 90 s kill scenario).

Issue 10, item 7. Each scenario starts its own fleet of processes on 127.0.0.1: four
``prefixroute emulate`` replicas and a ``prefixroute serve`` gateway in front, configured by a
TOML file. The client runs in this process. The scenarios, their targets and how each column is
counted are in ``tests/chaos/`` (``faults.py``, ``abuse.py``); the CI tests run the same code
smaller. Printed: one table, scenario | sent | ok | hung | lost | cut with error | ejections |
canary failures | notes, with the targets a scenario missed at the start of its notes. The
baseline is the targets themselves (0 hung, 0 lost, ...), not another system: the table is
meant to be run before and after a change to the gateway, on the same machine.

* kill: 20 clients, ``kill -9`` of a random replica every 8 s, restarted 2 s later
  (``--duration`` seconds).
* freeze: one replica SIGSTOPped for 12 s under streaming load (first-byte bound 10 s).
* poison: 100 requests of each poison kind, a canary every 50 ms.
* paths: every traversal form the suite knows, GET and POST, on raw sockets.
* slow readers: 16 clients at 1 byte/s, ``--max-in-flight-per-replica 4``.
* shutdown: SIGTERM under load with a 3 s drain bound.

Process logs stay under a temporary folder, printed at the end (kept with ``--keep-logs``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The scenarios live with their tests: the package ``chaos`` in tests/.
sys.path.insert(0, str(ROOT / "tests"))

from chaos import abuse, faults  # noqa: E402
from chaos.harness import Result, table  # noqa: E402

Scenario = Callable[[Path, argparse.Namespace], Awaitable[Result]]
SCENARIOS: dict[str, Scenario] = {
    "kill": lambda d, a: faults.kill(d, duration_s=a.duration),
    "freeze": lambda d, a: faults.freeze(d),
    "poison": lambda d, a: abuse.poison(d),
    "paths": lambda d, a: abuse.paths(d),
    "slow_readers": lambda d, a: abuse.slow_readers(d),
    "shutdown": lambda d, a: faults.shutdown(d),
}


def _tree() -> str:
    """Which code ran: the commit and the working tree's changes (``git diff --stat``)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip()

    stat = git("diff", "--stat", "HEAD").splitlines()
    new = len(git("ls-files", "--others", "--exclude-standard").splitlines())
    changed = stat[-1].strip() if stat else "no tracked file changed"
    return f"HEAD {git('rev-parse', '--short', 'HEAD')}, working tree: {changed}, {new} new files"


def _code() -> str:
    """Where the servers' ``prefixroute`` comes from (``PYTHONPATH`` can point elsewhere)."""
    spec = importlib.util.find_spec("prefixroute")
    origin = Path(spec.origin).parent.parent if spec and spec.origin else None
    return str(origin) if origin is not None else "?"


async def _run(names: list[str], args: argparse.Namespace, logs: Path) -> list[Result]:
    results = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            result = await SCENARIOS[name](logs / name, args)
        except Exception as exc:  # a scenario that cannot run is a row too, not a crash
            result = Result(name, missed=[f"did not run: {type(exc).__name__}: {exc}"[:300]])
        print(f"  {result.row()}  ({result.wall_s:.0f} s)", file=sys.stderr, flush=True)
        results.append(result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=90.0, help="kill scenario, seconds")
    parser.add_argument("--scenario", default="all", choices=["all", *SCENARIOS])
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--keep-logs", action="store_true", help="keep the process logs")
    args = parser.parse_args()
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    logs = Path(tempfile.mkdtemp(prefix="prefixroute-chaos-"))
    # Read before running: others may commit while it runs (the servers load the code then).
    header = f"Chaos suite, {_tree()}, code from {_code()}, {time.strftime('%Y-%m-%d %H:%M')}"
    started = time.monotonic()
    results = asyncio.run(_run(names, args, logs))
    text = f"{header}, {time.monotonic() - started:.0f} s\n\n{table(results)}\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    if args.keep_logs:
        print(f"process logs: {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 0 if all(not r.missed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
