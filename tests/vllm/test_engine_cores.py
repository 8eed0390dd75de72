"""Each engine runs on its own core, every process of it (``VLLMServer.start``).

Not only the model's threads (``VLLM_CPU_OMP_THREADS_BIND``): vLLM's engine-core process
busy-polls its worker while the worker computes. Left free to run on the other engine's core,
it slowed that engine whenever this one was busy, and the TTFT prediction test measured the
neighbour's traffic (docs/vllm.md, *Each engine on its own core*).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .engines import VLLMServer

pytestmark = pytest.mark.vllm


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def test_every_process_of_an_engine_runs_on_its_own_core(engines: list[VLLMServer]) -> None:
    assert len({e.cpu for e in engines}) == len(engines)
    for engine in engines:
        assert engine.proc is not None and engine.cpu is not None
        tree = process_tree(engine.proc.pid)
        assert len(tree) >= 3, tree  # the API server, its engine core, the engine's worker
        for pid in tree:
            threads = Path(f"/proc/{pid}/task")
            for tid in (int(t.name) for t in threads.iterdir()):
                try:
                    cores = os.sched_getaffinity(tid)
                except OSError:  # the thread ended meanwhile
                    continue
                assert cores == {engine.cpu}, (engine.name, pid, tid, cores)
