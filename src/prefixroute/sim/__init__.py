"""The simulator: a seeded discrete-event kernel, vLLM's scheduler in miniature, and workloads.

Score policies on a workload (what ``prefixroute simulate`` does)::

    from prefixroute.sim import ReplicaConfig, compare_policies, make_workload, print_report

    workload = make_workload("seed-conversation", seed=0)
    cmp = compare_policies(workload, ["round_robin", "predicted_ttft"], replicas=5,
                           replica_config=ReplicaConfig(block_size=workload.block_size))
    print_report(cmp.metrics, workload.name)

One run by hand: :class:`ClusterSim` over a :class:`Kernel`, scored by :func:`summarize` against
:func:`oracle_floor`. ``prefixroute.emulate`` runs the same :class:`ReplicaModel` in real time.
The modules (``kernel``, ``realtime`` (the kernel on the wall clock), ``replica``, ``stepper``
(a replica's step loop, shared by the simulator and the emulator), ``cluster``, ``fleet``,
``workload``, ``workloads``, ``metrics``, ``report``, ``runner``) each hold one job; import
from here.

The names load on first use (PEP 562): the emulator and the Ray Serve replicas import the
replica model alone, and an eager surface would add numpy, rich and every workload to each of
them (0.84 s to 1.02 s for ``import prefixroute.emulate``, measured 2026-11-30).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefixroute.sim.cluster import (
        ClusterSim,
        ReplicaRecord,
        RequestRecord,
        RunResult,
        SpeedSample,
    )
    from prefixroute.sim.fleet import (
        CHANGE_HELP,
        FLEET_HELP,
        Fleet,
        SpeedChange,
        check_fits,
        check_replica_count,
        fleet_from_flags,
        parse_fleet,
        parse_speed_change,
    )
    from prefixroute.sim.kernel import Kernel
    from prefixroute.sim.metrics import DEFAULT_TTFT_SLO_S, PolicyMetrics, oracle_floor, summarize
    from prefixroute.sim.parallel import usable_cpus
    from prefixroute.sim.progress import LazyProgress
    from prefixroute.sim.realtime import FellBehind, RealtimeKernel
    from prefixroute.sim.replica import (
        EngineRequest,
        ReplicaConfig,
        ReplicaModel,
        StepResult,
        StoredBlock,
    )
    from prefixroute.sim.report import (
        SIM_ONLY_COLUMNS,
        check_plot_path,
        make_console,
        markdown_table,
        print_report,
        summary_table,
        write_json,
        write_plot,
    )
    from prefixroute.sim.runner import (
        Comparison,
        ComparisonPlan,
        PolicyRun,
        compare_policies,
        plan_comparison,
        run_comparisons,
    )
    from prefixroute.sim.stepper import ReplicaStepper
    from prefixroute.sim.workload import ClusterEvent, Session, SessionSource, Turn, Workload
    from prefixroute.sim.workloads import (
        UnknownWorkload,
        make_workload,
        workload_names,
        workload_params,
    )

__all__ = [
    "CHANGE_HELP",
    "DEFAULT_TTFT_SLO_S",
    "FLEET_HELP",
    "SIM_ONLY_COLUMNS",
    "ClusterEvent",
    "ClusterSim",
    "Comparison",
    "ComparisonPlan",
    "EngineRequest",
    "FellBehind",
    "Fleet",
    "Kernel",
    "LazyProgress",
    "PolicyMetrics",
    "PolicyRun",
    "RealtimeKernel",
    "ReplicaConfig",
    "ReplicaModel",
    "ReplicaRecord",
    "ReplicaStepper",
    "RequestRecord",
    "RunResult",
    "Session",
    "SessionSource",
    "SpeedChange",
    "SpeedSample",
    "StepResult",
    "StoredBlock",
    "Turn",
    "UnknownWorkload",
    "Workload",
    "check_fits",
    "check_replica_count",
    "check_plot_path",
    "compare_policies",
    "fleet_from_flags",
    "make_console",
    "make_workload",
    "markdown_table",
    "oracle_floor",
    "parse_fleet",
    "parse_speed_change",
    "plan_comparison",
    "print_report",
    "run_comparisons",
    "summarize",
    "summary_table",
    "usable_cpus",
    "workload_names",
    "workload_params",
    "write_json",
    "write_plot",
]

# The modules, lightest first. A name is looked up in this order, so the replica model alone
# (what the emulator needs) never loads numpy, rich or the workloads.
_MODULES = ("kernel", "realtime", "replica", "stepper", "fleet", "workload", "cluster", "metrics",
            "workloads", "progress", "parallel", "runner", "report")  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in _MODULES:
            found = vars(importlib.import_module(f"{__name__}.{module}"))
            if name in found:
                return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
