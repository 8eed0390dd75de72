"""Scenarios where the servers fail under load: kill, freeze, shutdown.

Each runs a fresh :class:`Fleet` under ``log_dir`` and returns a :class:`Result` whose
``missed`` lists the targets it did not meet (issue 10, item 7):

* **kill**: concurrent multi-turn clients, plain and streaming; every ``kill_every_s`` a random
  replica gets ``kill -9`` and is restarted on its port ``down_s`` later. Targets: nothing hung,
  nothing lost (no silent cut), no error before the first byte (those must be retried).
* **freeze**: streaming load with think time between turns; the replica holding the most
  conversations is SIGSTOPped for ``freeze_s``, then SIGCONTed. Target: no request waits
  longer than ``bound_s`` (+ ``TIMING_SLACK_S``) for its first event (the gateway's first-byte
  deadline; the freeze lasts longer than the bound, so a gateway that just waits for the
  replica to wake up cannot meet it by luck). Streams already under way only stall.
* **shutdown**: streaming and plain load, some streams longer than the drain bound; SIGTERM.
  Targets: each request in flight at SIGTERM ends whole or with an explicit error within
  ``bound_s``; a new request during the drain gets a JSON 503 or a refused connection (an
  idle keep-alive connection may be closed; a request that beat the signal is not counted);
  the process exits within ``bound_s`` + 2 s (both + ``TIMING_SLACK_S``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from .clients import (
    CHAT,
    MODEL,
    Kind,
    Outcome,
    RawResponse,
    converse,
    parse_response,
    raw_bytes,
    raw_request,
    seeded_system,
    session,
)
from .harness import HOST, EjectionWatcher, Fleet, Result

DRAINING = ("503 JSON", "refused")  # what a new request may get while the gateway drains
TIMING_SLACK_S = 0.5  # scheduling noise allowed on a measured bound (loaded 2-core machine)


def count(result: Result, outcomes: Iterable[Outcome]) -> Counter[str]:
    """Add ``outcomes`` to ``result``'s columns; returns the non-ok details, counted."""
    details: Counter[str] = Counter()
    for o in outcomes:
        result.sent += 1
        if o.kind is Kind.OK:
            result.ok += 1
            continue
        details[f"{o.kind.value}: {o.detail}"] += 1
        if o.kind is Kind.HUNG:
            result.hung += 1
        elif o.kind is Kind.LOST:
            result.lost += 1
        else:
            result.cut_with_error += 1
            result.before_first_byte += o.data_events == 0
    return details


def top(details: Counter[str], n: int = 4) -> str:
    return ", ".join(f"{what} x{k}" for what, k in details.most_common(n))


async def kill(
    log_dir: Path,
    *,
    duration_s: float = 90.0,
    clients: int = 20,
    kill_every_s: float = 8.0,
    down_s: float = 2.0,
    timeout_s: float = 60.0,
    seed: int = 0,
) -> Result:
    result = Result("kill")
    rng, system = seeded_system(seed)
    outcomes: list[Outcome] = []
    kills: list[int] = []
    async with Fleet(log_dir) as fleet, session() as client, EjectionWatcher(fleet) as watcher:
        stop_at = time.monotonic() + duration_s

        async def user(i: int) -> None:
            crng = random.Random(seed * 1000 + i)
            await converse(
                client, fleet.url + CHAT, crng, system,
                running=lambda: time.monotonic() < stop_at,
                body=lambda conv: conv.body(stream=i % 2 == 0, max_tokens=crng.randint(30, 120)),
                timeout_s=timeout_s, sent=lambda t, o: outcomes.append(o),
            )  # fmt: skip

        async def chaos() -> None:
            next_at = time.monotonic() + kill_every_s
            while next_at + down_s < stop_at:
                await asyncio.sleep(next_at - time.monotonic())
                victim = rng.randrange(fleet.n)
                fleet.replicas[victim].kill9()
                kills.append(victim)
                await asyncio.sleep(down_s)
                await fleet.restart_replica(victim)
                next_at += kill_every_s

        await asyncio.gather(chaos(), *(user(i) for i in range(clients)))
    details = count(result, outcomes)
    result.finish(watcher)
    result.notes.append(f"{len(kills)} kills in {duration_s:.0f} s, {clients} clients")
    result.notes.append(f"errors before first byte: {result.before_first_byte}")
    if details:
        result.notes.append(top(details))
    result.check(result.hung == 0, "0 hung")
    result.check(result.lost == 0, "0 lost")
    result.check(result.before_first_byte == 0, "0 failures before the first byte")
    return result


async def freeze(
    log_dir: Path,
    *,
    freeze_s: float = 12.0,
    bound_s: float = 10.0,
    clients: int = 12,
    warmup_s: float = 3.0,
    after_s: float = 4.0,
    timeout_s: float = 60.0,
    seed: int = 1,
) -> Result:
    result = Result("freeze")
    rng, system = seeded_system(seed)
    outcomes: list[Outcome] = []
    homes: dict[int, int | None] = {}  # client -> replica that answered its last turn
    sent: list[tuple[float, int | None]] = []  # (start, replica that answered)
    frozen: list[tuple[float, int, int]] = []  # (when, replica, conversations it held)
    async with Fleet(log_dir) as fleet, session() as client, EjectionWatcher(fleet) as watcher:
        done = asyncio.Event()

        async def user(i: int) -> None:
            crng = random.Random(seed * 1000 + i)

            def record(t: float, o: Outcome) -> None:
                outcomes.append(o)
                sent.append((t, fleet.replica_index(o.replica)))
                if o.kind is Kind.OK:
                    homes[i] = fleet.replica_index(o.replica)

            async def think(o: Outcome) -> None:
                # At any moment some clients are between turns, and their next turn goes to
                # the replica that holds their conversation.
                await asyncio.sleep(crng.uniform(0.5, 1.5))

            await converse(
                client, fleet.url + CHAT, crng, system,
                running=lambda: not done.is_set(),
                body=lambda conv: conv.body(stream=True, max_tokens=crng.randint(30, 80)),
                timeout_s=timeout_s, sent=record, between=think,
            )  # fmt: skip

        async def chaos() -> None:
            await asyncio.sleep(warmup_s)
            # The replica that holds the most conversations: their next turns go there (prefix
            # affinity) and wait on it. A replica picked at random may be idle, and freezing it
            # would test nothing; streams already under way just stall mid-stream.
            held = Counter(h for h in homes.values() if h is not None)
            index = held.most_common(1)[0][0] if held else rng.randrange(fleet.n)
            frozen.append((time.monotonic(), index, held[index]))
            victim = fleet.replicas[index]
            victim.freeze()
            await asyncio.sleep(freeze_s)
            victim.thaw()
            await asyncio.sleep(after_s)
            done.set()

        await asyncio.gather(chaos(), *(user(i) for i in range(clients)))
    details = count(result, outcomes)
    waits = sorted(o.wait_s if o.wait_s is not None else o.elapsed_s for o in outcomes)
    # The slack covers the retry's own first event after a deadline the gateway set at the
    # bound itself (its floor is 10 s by default), and scheduling noise.
    over = sum(1 for w in waits if w > bound_s + TIMING_SLACK_S)
    t_freeze, index, held = frozen[0]
    on_frozen = sum(1 for t, r in sent if r == index and t_freeze <= t <= t_freeze + freeze_s)
    result.finish(watcher)
    result.notes.append(
        f"SIGSTOP {freeze_s:.0f} s of the home of {held} conversations, which answered "
        f"{on_frozen} requests sent while frozen; first-event wait max "
        f"{waits[-1]:.2f} s, p99 {waits[int(0.99 * (len(waits) - 1))]:.2f} s; "
        f"{over} over {bound_s:.0f} s"
    )
    if details:
        result.notes.append(top(details))
    result.check(over == 0, f"no wait over {bound_s:.0f} s")
    result.check(result.hung == 0, "0 hung")
    result.check(result.lost == 0, "0 lost")
    return result


async def _keepalive_probe(port: int, warm: bytes, probe: bytes, delay_s: float) -> str:
    """One request on a fresh keep-alive connection, then another ``delay_s`` later (the
    caller SIGTERMs in between); what became of the second one."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(warm)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), b"0"))  # fmt: skip
        await reader.readexactly(length)
        await asyncio.sleep(delay_s)
        if reader.at_eof():
            return "idle, closed"
        writer.write(probe)
        async with asyncio.timeout(15):
            data = await reader.read()
    except (OSError, asyncio.IncompleteReadError):
        return "keep-alive reset"
    finally:
        writer.close()
    return _drain_verdict(parse_response(data))


def _drain_verdict(resp: RawResponse | None) -> str:
    if resp is None:
        return "closed without an answer"
    js = resp.json()
    if resp.status == 503 and isinstance(js, dict) and "error" in js:
        return "503 JSON"
    return f"{resp.status}{' JSON' if isinstance(js, dict) else ' non-JSON'}"


async def shutdown(
    log_dir: Path,
    *,
    bound_s: float = 3.0,
    clients: int = 16,
    load_s: float = 3.0,
    long_tokens: int = 600,
    short_tokens: int = 40,
    seed: int = 2,
) -> Result:
    result = Result("shutdown")
    rng, system = seeded_system(seed)
    runs: list[tuple[float, Outcome]] = []  # (start, outcome)
    probes: Counter[str] = Counter()
    body = b'{"model":"%s","max_tokens":1,"messages":[{"role":"user","content":"drain"}]}'
    headers = {"Content-Type": "application/json"}
    small = raw_bytes("POST", CHAT, body % MODEL.encode(), headers)
    warm = raw_bytes("POST", CHAT, body % MODEL.encode(), headers, keep_alive=True)
    async with Fleet(log_dir, settings={"shutdown_timeout_s": bound_s}) as fleet:
        assert fleet.gateway is not None
        stop_sending = asyncio.Event()
        async with session() as client:

            async def user(i: int) -> None:
                tokens = long_tokens if i % 2 == 0 else short_tokens
                await converse(
                    client, fleet.url + CHAT, random.Random(seed * 1000 + i), system,
                    running=lambda: not stop_sending.is_set(),
                    body=lambda conv: conv.body(stream=i % 4 != 3, max_tokens=tokens),
                    timeout_s=bound_s + 15, sent=lambda t, o: runs.append((t, o)),
                )  # fmt: skip

            users = [asyncio.create_task(user(i)) for i in range(clients)]
            keepalive = asyncio.create_task(
                _keepalive_probe(fleet.gateway_port, warm, small, load_s + 0.5)
            )
            await asyncio.sleep(load_s)
            stop_sending.set()
            await asyncio.sleep(0.2)  # what was sent has reached the gateway
            t_term = time.monotonic()
            draining = False
            fleet.gateway.terminate()
            while fleet.gateway.alive and time.monotonic() < t_term + bound_s + 10:
                sent_after = time.monotonic() - t_term
                try:
                    verdict = _drain_verdict(await raw_request(fleet.gateway_port, small))
                except ConnectionRefusedError:
                    verdict = "refused"
                except (OSError, TimeoutError) as exc:
                    verdict = type(exc).__name__
                # A request that beat the signal (before the first 503, and within the timing
                # slack) is not "during the drain".
                if draining or verdict in DRAINING or sent_after > TIMING_SLACK_S:
                    draining = True
                    probes[verdict] += 1
                await asyncio.sleep(0.1)
            exited = await fleet.gateway.wait_exit(0)
            exit_s = time.monotonic() - t_term
            probes["keep-alive: " + await keepalive] += 1
            await asyncio.gather(*users)
    in_flight = [(t, o) for t, o in runs if t + o.elapsed_s > t_term]
    late = [o for t, o in in_flight if t + o.elapsed_s > t_term + bound_s + TIMING_SLACK_S]
    count(result, (o for _, o in runs))
    bad_probes = {
        k: v
        for k, v in probes.items()
        if k.removeprefix("keep-alive: ") not in (*DRAINING, "idle, closed")
    }
    kinds = Counter(o.kind.value for _, o in in_flight)
    result.finish()
    result.notes.append(
        f"in flight at SIGTERM: {len(in_flight)} ({dict(kinds)}), {len(late)} ended after "
        f"{bound_s:.0f} s; exit after {exit_s:.1f} s; new requests while draining: {dict(probes)}"
    )
    result.check(result.hung == 0 and result.lost == 0, "0 hung, 0 lost")
    result.check(not late, f"in-flight requests end within {bound_s:.0f} s")
    result.check(not bad_probes, "new requests get 503 JSON or refused")
    result.check(
        exited and exit_s <= bound_s + 2 + TIMING_SLACK_S, f"exit within {bound_s + 2:.0f} s"
    )
    return result
