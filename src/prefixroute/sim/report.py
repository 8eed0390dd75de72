"""Presenting scores: a rich table on the terminal, JSON for machines, a matplotlib figure."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from prefixroute.core import ConfigError
from prefixroute.sim.metrics import PolicyMetrics


def make_console() -> Console:
    """A console for reports: the terminal's width; piped, ``$COLUMNS`` or a wide 200 (so a
    file or a README gets whole tables)."""
    import os
    import sys

    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else 200)


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


# Columns only a simulation can fill: a live run sees neither the engines' evictions nor the
# gateway's decision time (bench hides them; its metrics hold None for them, "-" if shown).
SIM_ONLY_COLUMNS = ("evict", "route µs p99")


SUMMARY_COLUMNS = (
    "policy",
    "prefill tok",
    "cached tok",
    "x floor",
    "hit %",
    "TTFT p50",
    "p90",
    "p99 ms",
    "E2E p99 ms",
    "goodput/s",
    "evict",
    "route µs p99",
    "requests per replica",
)
# A narrow terminal gets the summary as two tables: the work done, then the latency.
SUMMARY_HALVES = (
    ("prefill tok", "cached tok", "x floor", "hit %", "evict", "requests per replica"),
    ("TTFT p50", "p90", "p99 ms", "E2E p99 ms", "goodput/s", "route µs p99"),
)


def _column(table: Table, name: str) -> None:
    """Numbers right-aligned and never cut: in a cramped terminal they fold onto a second line
    rather than lose digits behind an ellipsis."""
    left = name.startswith(("policy", "req")) or name.endswith("replica")
    # Names stay whole (the table shrinks the other columns first).
    whole = name in ("policy", "request", "replica")
    table.add_column(name, justify="left" if left else "right", overflow="fold", no_wrap=whole)


def summary_table(
    metrics: Sequence[PolicyMetrics],
    title: str,
    live: bool = False,
    only: Sequence[str] | None = None,
) -> Table:
    """One row per policy: prefill work, cache hits, latency, balance, routing cost
    (``only``: the policy and these columns)."""
    table = Table(title=title, title_justify="left", header_style="bold")
    columns = SUMMARY_COLUMNS
    shown = [
        not (live and col in SIM_ONLY_COLUMNS) and (only is None or col == "policy" or col in only)
        for col in columns
    ]
    for col, show in zip(columns, shown, strict=True):
        if show:
            _column(table, col)
    for m in metrics:
        cells = (
            m.policy,
            _fmt_int(m.prefill_tokens),
            _fmt_int(m.cached_tokens),
            "-" if m.floor_ratio is None else f"{m.floor_ratio:.2f}",
            f"{100 * m.hit_rate:.1f}",
            f"{m.ttft_ms['p50']:.0f}",
            f"{m.ttft_ms['p90']:.0f}",
            f"{m.ttft_ms['p99']:.0f}",
            f"{m.e2e_ms['p99']:.0f}",
            f"{m.goodput_rps:.2f}",
            _fmt_int(m.evictions),
            "-" if m.decision_us is None else f"{m.decision_us['p99']:.0f}",
            " ".join(str(v) for v in m.per_replica_requests.values()),
        )
        table.add_row(*(c for c, show in zip(cells, shown, strict=True) if show))
    return table


def turns_table(metrics: Sequence[PolicyMetrics]) -> Table | None:
    """Per-request detail for small workloads (the article's worked examples)."""
    if not metrics or not metrics[0].turns:
        return None
    table = Table(title="per request", title_justify="left", header_style="bold")
    _column(table, "request")
    _column(table, "prompt")
    for m in metrics:
        _column(table, f"{m.policy}: replica")
        for name in ("cached", "computed", "TTFT ms"):
            _column(table, name)
    for i, first in enumerate(metrics[0].turns):
        row = [str(first["request"]), f"{first['prompt_tokens']:,}"]
        for m in metrics:
            t = m.turns[i]
            ttft = "-" if t["ttft_ms"] is None else f"{t['ttft_ms']:.0f}"
            row += [t["replica"], f"{t['cached_tokens']:,}", f"{t['computed_tokens']:,}", ttft]
        table.add_row(*row)
    totals = ["total", f"{metrics[0].prompt_tokens:,}"]
    for m in metrics:
        totals += ["", f"{m.cached_tokens:,}", f"{m.prefill_tokens:,}", f"{m.ttft_total_ms:.0f}"]
    table.add_row(*totals, style="bold")
    return table


def speed_table(metrics: Sequence[PolicyMetrics]) -> Table | None:
    """Per replica: its true speed and what the router learned of it under each policy.

    Every policy's router learns (the estimates do not depend on the policy using them), but
    what a replica is sent, and so what it teaches, does.
    """
    if not metrics or not metrics[0].per_replica_speed:
        return None
    table = Table(
        title="speed per replica: true, and learned by the router (x true)",
        title_justify="left",
        header_style="bold",
    )
    speeds = metrics[0].per_replica_speed
    # Attention columns where a replica has it: the context at which a token costs double.
    attention = any(s.get("attention_tokens") for s in speeds.values())
    # Requests each engine preempted, where any did: work no router counts (sim/preemption.py).
    preempted = any(
        s.get("preemptions") for m in metrics for s in (m.per_replica_speed or {}).values()
    )
    for name in ("replica", "prefill tok/s", "decode ms", "attention tok")[: 3 + attention]:
        _column(table, name)
    for m in metrics:
        _column(table, f"{m.policy}: prefill")
        _column(table, "decode")
        if attention:
            _column(table, "attention")
        if preempted:
            _column(table, "preempted")
    for r in sorted(speeds, key=_replica_order):
        true = speeds[r]
        row = [r, f"{true['prefill_tokens_per_s']:,.0f}", f"{true['decode_step_s'] * 1000:.1f}"]
        if attention:
            row.append(f"{true['attention_tokens']:,.0f}" if true["attention_tokens"] else "-")
        for m in metrics:
            learned = (m.per_replica_speed or {}).get(r)
            row += _learned_cells(true, learned, attention)
            if preempted:
                row.append(f"{learned.get('preemptions', 0):,.0f}" if learned else "-")
        table.add_row(*row)
    return table


def _learned_cells(
    true: dict[str, float], s: dict[str, float] | None, attention: bool
) -> list[str]:
    """A policy's learned prefill rate, decode step (and attention) of one replica, each with
    its ratio to the truth."""
    if s is None:
        return ["-"] * (2 + attention)
    rate, step = s["learned_prefill_tokens_per_s"], s["learned_decode_step_s"]
    true_step = s["decode_step_s"]
    cells = [
        f"{rate:,.0f} ({rate / s['prefill_tokens_per_s']:.2f})",
        f"{step * 1000:.1f} ({step / true_step:.2f})" if true_step else "-",
    ]
    if attention:
        learned, at = s.get("learned_attention_tokens", 0.0), true["attention_tokens"]
        ratio = f" ({learned / at:.2f})" if learned and at else ""
        cells.append(f"{learned:,.0f}{ratio}" if learned else "-")
    return cells


def print_report(
    metrics: Sequence[PolicyMetrics], title: str, console: Console | None = None, live: bool = False
) -> None:
    """The tables of a run; ``live``: measured on real servers (no simulation-only columns)."""
    console = console or make_console()
    detail = turns_table(metrics)
    if detail is not None:
        _print_fitting(console, [detail], [turns_table([m]) for m in metrics])
    halves = [
        summary_table(metrics, f"{title}: {part}", live, half)
        for part, half in zip(("work", "latency"), SUMMARY_HALVES, strict=True)
    ]
    _print_fitting(console, [summary_table(metrics, title, live)], halves)
    # A simulated request always ends unless a replica refused it (too large for its KV
    # cache); the table cannot show that (NaN, zeros), so say it. Bench says its own errors.
    failed = [] if live else [m for m in metrics if m.completed < m.requests]
    for m in failed:
        console.print(f"{m.policy}: {m.requests - m.completed:,} of {m.requests:,} requests failed")
    speeds = speed_table(metrics)
    if speeds is not None and len(metrics[0].per_replica_speed or ()) <= 16:
        _print_fitting(console, [speeds], [speed_table([m]) for m in metrics])
    floor = metrics[0].oracle_floor if metrics else None
    if floor is not None:
        console.print(
            f"oracle floor: {floor:,} prompt tokens must be computed at least once "
            f"(of {metrics[0].prompt_tokens:,}); TTFT SLO for goodput: "
            f"{metrics[0].ttft_slo_ms:.0f} ms"
        )


def _print_fitting(
    console: Console, whole: Sequence[Table | None], parts: Sequence[Table | None]
) -> None:
    """``whole`` if it fits the console's width, else ``parts`` (the same cells as narrower
    tables), which fold their cells if even they do not fit."""
    wide = console.options.update_width(1_000_000)
    fits = all(
        t is None or Measurement.get(console, wide, t).maximum <= console.width for t in whole
    )
    for table in whole if fits else parts:
        if table is not None:
            console.print(table)


def markdown_table(metrics: Sequence[PolicyMetrics]) -> str:
    """Workload x policy rows for the README: prefill vs floor, hit rate, TTFT, goodput."""
    lines = [
        "| workload | policy | prefill / floor | hit % | TTFT p50 ms | p90 | p99 | "
        "E2E p99 ms | goodput/s | evictions |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    best: dict[str, float] = {}
    for m in metrics:
        best[m.workload] = min(best.get(m.workload, float("inf")), m.ttft_ms["p99"])
    for m in metrics:
        p99 = f"{m.ttft_ms['p99']:.0f}"
        if m.ttft_ms["p99"] == best[m.workload]:
            p99 = f"**{p99}**"
        ratio = "-" if m.floor_ratio is None else f"{m.floor_ratio:.2f}"
        lines.append(
            f"| {m.workload} | {m.policy} | {ratio} | {100 * m.hit_rate:.1f} | "
            f"{m.ttft_ms['p50']:.0f} | {m.ttft_ms['p90']:.0f} | {p99} | {m.e2e_ms['p99']:.0f} | "
            f"{m.goodput_rps:.2f} | {_fmt_int(m.evictions)} |"
        )
    return "\n".join(lines) + "\n"


def write_json(metrics: Sequence[PolicyMetrics], out: IO[str], extra: dict[str, Any]) -> None:
    json.dump({**extra, "policies": [m.to_json() for m in metrics]}, out, indent=2)
    out.write("\n")


def check_plot_path(path: Path) -> None:
    """ConfigError unless matplotlib can write ``path``'s format (its suffix; none is PNG).
    Checked before a run: ``savefig`` refuses an unknown suffix only once the run is over."""
    from matplotlib.backend_bases import FigureCanvasBase

    if not path.name or path.is_dir():  # --plot '' failed once the run was over
        raise ConfigError(f"--plot {str(path)!r}: give a file name, not a folder")
    # Where it will go (missing folders are made): a file in the way, or a folder we cannot
    # write, failed only once the run was over, as "File exists".
    held = next(p for p in (path.parent.absolute(), *path.parent.absolute().parents) if p.exists())
    if not held.is_dir() or not os.access(held, os.W_OK | os.X_OK):
        why = "is a file, not a folder" if not held.is_dir() else "cannot be written"
        raise ConfigError(f"--plot {path}: {held} {why}")
    kind = path.suffix.removeprefix(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if kind and kind not in formats:
        raise ConfigError(
            f"--plot {path}: matplotlib cannot write .{kind} files; use one of "
            + ", ".join(sorted(formats))
        )


def write_plot(
    metrics: Sequence[PolicyMetrics], ttfts_ms: dict[str, list[float]], path: Path, title: str
) -> Path:
    """TTFT CDF per policy (left) and requests per replica per policy (right); returns the file
    written: ``path``, with ``.png`` added when it has no suffix (as matplotlib adds it: the
    report named the file without it)."""
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for m in metrics:
        values = np.sort(np.asarray(ttfts_ms.get(m.policy, [])))
        if len(values):
            ax1.plot(values, np.arange(1, len(values) + 1) / len(values), label=m.policy)
    ax1.set_xscale("log")
    ax1.set_xlabel("time to first token (ms, log scale)")
    ax1.set_ylabel("fraction of requests")
    ax1.set_title("TTFT CDF")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    replicas = sorted({r for m in metrics for r in m.per_replica_requests}, key=_replica_order)
    width = 0.8 / max(1, len(metrics))
    x = np.arange(len(replicas))
    for i, m in enumerate(metrics):
        ax2.bar(
            x + i * width,
            [m.per_replica_requests.get(r, 0) for r in replicas],
            width,
            label=m.policy,
        )
    ax2.set_xticks(x + width * (len(metrics) - 1) / 2, replicas)
    ax2.set_ylabel("requests")
    ax2.set_title("load per replica")
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ConfigError(f"cannot write plot {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a format matplotlib refuses (check_plot_path comes first)
        raise ConfigError(f"cannot write plot {path}: {exc}") from exc
    finally:
        plt.close(fig)
    return path


def _replica_order(name: str) -> tuple[int, str]:
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else 0, name)
