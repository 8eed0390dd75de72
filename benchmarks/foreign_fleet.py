"""The router on replicas written by others: policies compared on ``foreign_replica.py``.

Issue 11 was measured from outside, on replicas written independently of this project. Our own
emulator shares the router's assumptions (its tokenizer counts the workload's words, its
blocks line up, its stream opens with the first token), so results on it can flatter the
router. ``foreign_replica.py`` was written on 2026-12-02 by a helper that had not read this
repository, from a description of how vLLM and SGLang behave from the outside. It has its own
tokenizer (most of the workload's words make 2 tokens), a 16-token page cache that also keeps
generated tokens, preemption and chunked continuous batching, and it opens a chat stream with
a role-only chunk before prefill. It is kept as its author wrote it.

``foreign_replica_b.py`` was written on 2026-12-04 by another helper that had not read this
repository, from a description of SGLang: a token-granular radix cache in a 65,536-token pool
shared with running sequences, admission by free KV (SGLang's reserve ratio) and retraction,
prefill passes that run before decode steps, decode steps that slow with the batch and its
context, a tokenizer of 3-character pieces, SGLang's metric names and stream. Run it with
``--replica benchmarks/foreign_replica_b.py``; it too is kept as written.

``foreign_replica_c.py`` was written on 2026-12-05 by a third helper that had not read this
repository, from a description of vLLM's v1 engine: a hash-chained cache of full 16-token blocks
whose freed blocks stay cached until reused, a step token budget of 8,192 with chunked prefill
and preemption by recompute, a prefill step that also pays attention over the context (so a
token costs more the longer the prompt before it), lognormal jitter on every step, 4-character
tokens, vLLM's metric names and error bodies. ``--replica benchmarks/foreign_replica_c.py``;
kept as written.

``foreign_replica_d.py`` was written on 2026-12-06 by a fourth helper that had not read this
repository, as a re-implementation of llm-d-inference-sim (the Go vLLM simulator of the llm-d
project and the Gateway API Inference Extension's tests) from that project's own docs and
source: up to ``--max-num-seqs`` requests at once, each with its own time to first token
(``prefill-overhead + uncached x prefill-time-per-token``, scaled by ``time-factor-under-load``
with the running count) and none waiting on another's prefill, a FIFO queue beyond that, an LRU
block cache, its regex tokenizer and vLLM's metric names. It takes llm-d's flags, the model's
name among them (for the requests too): ``--replica benchmarks/foreign_replica_d.py --rate-as
time-per-token --model NAME --replica-arg=--model=NAME --replica-arg=...``.

For each policy this starts fresh replicas at the ``--fleet`` speeds, one ``prefixroute serve``
with default settings, and ``prefixroute bench --url`` on the workload. It prints each policy's
prefill against the floor (in the replicas' tokens), TTFT, and the default's p99 as a ratio to
the best other policy's, measured in the same run. Then it prints the prefill rate the gateway
learned for each replica, beside the true one.

Run: ``.venv/bin/python benchmarks/foreign_fleet.py [-w multi-turn] [--set sessions=100]
[--fleet 10000,10000,2500,2500] [-p round_robin,least_loaded,cache_aware,predicted_ttft]
[--replica-arg=--no-cached-report] [--plain SHARE] [--tell-max-running N] [--replica FILE]``.
``--replica`` runs another server that takes the same flags. With ``--plain``, that share of
the requests asks for no stream: TTFT is over the streamed ones, the learned rates over all.
Each policy takes 1–7 minutes on a 2-vCPU machine, whose client, gateway and replicas share
the cores: compare policies of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from _procs import spawn, stop_all, wait_ready

from prefixroute.core import DEFAULT_POLICY

REPLICA = Path(__file__).with_name("foreign_replica.py")
# How a replica is told its prefill rate: ours and the first three foreign replicas take
# tokens/s; llm-d-inference-sim (foreign_replica_d.py) takes the time per token.
RATE_FLAGS = {
    "tps": lambda tps: ["--prefill-tps", f"{tps:g}"],
    "time-per-token": lambda tps: ["--prefill-time-per-token", f"{1e6 / tps:.0f}us"],
}
BASELINES = ("round_robin", "least_loaded", "cache_aware")
LEARNED = "prefixroute_replica_prefill_tokens_per_second"
ATTENTION = "prefixroute_replica_prefill_attention_seconds{"
ERROR = "prefixroute_replica_ttft_prediction_error{"
OBSERVED = 'prefixroute_replica_speed_observations{phase="prefill",'
CLEARED = "prefixroute_replica_cache_lost_total{"  # whole indexes forgotten (restart, refused)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica(NamedTuple):
    """One replica of ``--fleet``: its prefill rate and its own flags beside it."""

    tps: float  # prefill rate, tokens/s
    flags: tuple[str, ...]  # e.g. ("--decode-ms", "30", "--kv-tokens", "32768")


def _fleet(text: str) -> list[Replica]:
    """--fleet: each replica as ``RATE[:FLAG=VALUE...]``, comma-separated: its prefill rate,
    tokens/s, then flags of its own (``2500:decode-ms=30:kv-tokens=32768``: a replica of older
    hardware, slower to decode and holding less)."""
    out = []
    for entry in text.split(","):
        rate, *flags = entry.split(":")
        try:
            tps = float(rate)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"each replica as RATE[:FLAG=VALUE...], e.g. 10000,2500:decode-ms=30: {entry!r}"
            ) from None
        if not tps > 0:
            raise argparse.ArgumentTypeError("every prefill rate must be positive")
        argv: list[str] = []
        for flag in flags:
            name, eq, value = flag.partition("=")
            if not eq or not name:
                raise argparse.ArgumentTypeError(f"a replica's flag as FLAG=VALUE: {flag!r}")
            argv += [f"--{name}", value]
        out.append(Replica(tps, tuple(argv)))
    return out


def _by_replica(text: str, prefix: str) -> dict[str, float]:
    """The value of each metric line starting with ``prefix``, by its replica label."""
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('replica="', 1)[1].split('"', 1)[0]] = float(value)
    return out


async def _learned(url: str) -> tuple[dict[str, tuple[float, float, float]], float]:
    """The gateway's learned prefill rate of each replica, the context at which its prompt
    token costs double (NaN: no attention learned) and its median TTFT prediction error (NaN:
    none judged), by replica URL; all NaN for a replica it timed no first token of (the gateway
    shows its fleet's estimates there, not its own); and how many times the gateway forgot a
    replica's whole index (an engine restart or a refused connection), summed."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    seen = _by_replica(text, OBSERVED)
    rates = _by_replica(text, LEARNED + "{")
    attention, error = _by_replica(text, ATTENTION), _by_replica(text, ERROR)
    nan = float("nan")
    out = {}
    for u, r in rates.items():
        a = attention.get(u, 0.0)
        doubling = 1000.0 / (r * a) if a > 0 else nan
        out[u] = (r, doubling, error.get(u, nan)) if seen.get(u, 0) > 0 else (nan, nan, nan)
    return out, sum(_by_replica(text, CLEARED).values())


def run_policy(
    policy: str, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, tuple[float, float, float]]]:
    """One policy on fresh replicas: the bench's JSON row, and what was learned by URL
    (:func:`_learned`)."""
    ports = [_free_port() for _ in args.fleet]
    # A replica that fails says why (closed in the finally below).
    logs = [tempfile.TemporaryFile() for _ in args.fleet]  # noqa: SIM115
    replicas = [
        subprocess.Popen(
            [sys.executable, str(args.replica), "--port", str(port),
             *RATE_FLAGS[args.rate_as](rep.tps), "--seed", str(i), *args.replica_arg, *rep.flags],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        for i, (port, rep, log) in enumerate(zip(ports, args.fleet, logs, strict=True))
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    gw_port = _free_port()
    gw_url = f"http://127.0.0.1:{gw_port}"
    procs = list(replicas)
    try:
        try:
            asyncio.run(_ready(urls))
        except RuntimeError:
            for proc, log in zip(replicas, logs, strict=True):
                if proc.poll() is not None:
                    log.seek(0)
                    why = log.read().decode(errors="replace").strip().splitlines()
                    raise SystemExit(f"foreign_fleet: a replica exited: {why[-1:]}") from None
            raise
        serve = ["serve", "--port", str(gw_port), "--policy", policy, *args.serve_arg]
        if args.tell_max_running:  # each replica's batch size, as its operator would give it
            serve += [x for u in urls
                      for x in ("--replica-speed", f"{u}=max_running={args.tell_max_running}")]
        procs.append(spawn(serve + [x for u in urls for x in ("--replica", u)]))
        asyncio.run(_ready([gw_url]))
        time.sleep(3.0)  # a health round: models and metrics known
        bench = [sys.executable, "-m", "prefixroute.cli", "bench", "--url", gw_url, "--json",
                 "--label", policy, "-w", args.workload, "--seed", str(args.seed)]  # fmt: skip
        for kv in args.set:
            bench += ["--set", kv]
        if args.model:
            bench += ["--model", args.model]
        if args.plain:
            bench += ["--plain", str(args.plain)]
        out = subprocess.run(bench, check=False, capture_output=True, text=True)
        if out.returncode not in (0, 1):  # 1: some requests failed, still a row
            raise SystemExit(f"foreign_fleet: bench failed: {out.stderr.strip()[-400:]}")
        row = json.loads(out.stdout)["policies"][0]
        learned, row["index_clears"] = asyncio.run(_learned(gw_url))
        nan = float("nan")
        return row, {u: learned.get(u, (nan, nan, nan)) for u in urls}
    finally:
        stop_all(procs)
        for log in logs:
            log.close()


async def _ready(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for url in urls:
            await wait_ready(http, url + "/v1/models")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-w", "--workload", default="multi-turn")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fleet", type=_fleet, default=_fleet("10000,10000,2500,2500"),
                   help="each replica's prefill rate, tokens/s, and optional flags of its own "
                   "(RATE[:FLAG=VALUE...], e.g. 2500:decode-ms=30:kv-tokens=32768; "
                   "default 10000,10000,2500,2500)")
    p.add_argument("-p", "--policies", default=",".join((*BASELINES, DEFAULT_POLICY)))
    p.add_argument("--plain", type=float, default=0.0, metavar="SHARE",
                   help="share of the requests sent without a stream (bench --plain)")
    p.add_argument("--replica", type=Path, default=REPLICA, metavar="FILE",
                   help="the replica server to run, taking foreign_replica.py's flags "
                   "(default: foreign_replica.py beside this script)")
    p.add_argument("--replica-arg", action="append", default=[],
                   help="passed to every replica (e.g. --replica-arg=--no-cached-report)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="passed to every gateway (e.g. --serve-arg=--config=gw.toml; default none)")
    p.add_argument("--rate-as", choices=list(RATE_FLAGS), default="tps",
                   help="how the replica takes its prefill rate (time-per-token: llm-d-inference-"
                   "sim's --prefill-time-per-token, foreign_replica_d.py; default tps)")
    p.add_argument("--model", default="", help="the model each request names (a replica that "
                   "checks it, such as llm-d-inference-sim, needs its own; default: none)")
    p.add_argument("--tell-max-running", type=int, default=0, metavar="N",
                   help="give the gateway each replica's batch size, N (--replica-speed "
                   "URL=max_running=N; default 0: it learns it from their metrics, if it can)")
    args = p.parse_args(argv)
    if not args.replica.is_file():
        p.error(f"--replica: no such file: {args.replica}")
    policies = [x for x in args.policies.split(",") if x]
    rows, rates = {}, {}
    for policy in policies:
        rows[policy], rates[policy] = run_policy(policy, args)
    plain = f", {args.plain:.0%} plain" if args.plain else ""
    fleet = ", ".join(f"{r.tps:g}{' ' if r.flags else ''}{' '.join(r.flags)}" for r in args.fleet)
    where = f"{args.replica.name} replicas at [{fleet}] tokens/s, seed {args.seed}{plain}"
    print(f"## {args.workload} on {where}")
    print("policy            x floor  hit %   p50 ms   p90 ms   p99 ms  errors  index clears")
    for policy, r in rows.items():
        floor = r["floor_ratio"]
        ttft = r["ttft_ms"]
        print(f"{policy:<16} {floor if floor is not None else float('nan'):8.2f} "
              f"{100 * r['hit_rate']:6.1f} {ttft['p50']:8.0f} {ttft['p90']:8.0f} "
              f"{ttft['p99']:8.0f}  {r['errors']:6}  {r['index_clears']:.0f}")  # fmt: skip
    others = [rows[b]["ttft_ms"]["p99"] for b in rows if b != DEFAULT_POLICY]
    if DEFAULT_POLICY in rows and others:
        ratio = rows[DEFAULT_POLICY]["ttft_ms"]["p99"] / min(others)
        print(f"{DEFAULT_POLICY} p99 / best other policy's: x{ratio:.2f}")
    print("learned prefill rate per replica (true rate), tokens/s; '-': sent nothing timed;")
    print("  then the context at which a prompt token costs double, as learned (a:), and the")
    print("  median TTFT prediction error (e:)")
    for policy, by_url in rates.items():
        pairs = zip(by_url.values(), (r.tps for r in args.fleet), strict=True)
        cells = "  ".join(_cell(v, t) for v, t in pairs)
        print(f"  {policy:<16} {cells}")


def _cell(learned: tuple[float, float, float], true: float) -> str:
    rate, doubling, error = learned
    if rate != rate:
        return f"- ({true:,.0f})"
    att = f"{doubling:,.0f}" if doubling == doubling else "-"
    err = f"{error:.2f}" if error == error else "-"
    return f"{rate:,.0f} ({true:,.0f}) a:{att} e:{err}"


if __name__ == "__main__":
    main(sys.argv[1:])
