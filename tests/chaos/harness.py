"""Server processes for the chaos suite, and what the scenarios count.

Every server is a process of its own, started as ``python -m prefixroute.cli emulate|serve``
on 127.0.0.1, so a scenario can do to it what happens to real ones: ``kill -9``,
SIGSTOP/SIGCONT, a restart on the same port, SIGTERM. :class:`Fleet` starts N emulated
replicas and a gateway in front of them (settings through a ``--config`` TOML file, the way
production sets them) and, as an ``async with``, kills whatever is still running when it ends,
on failure too. Output goes to one log file per process (never a pipe that could fill up).

With ``tap``, a :class:`~.tap.Tap` stands between the gateway and each replica and records
the requests that reach it. :class:`EjectionWatcher` polls the gateway's
``prefixroute_replica_healthy`` gauge and counts each replica's step from 1 to 0.
:class:`Result` is one row of the results table.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from prefixroute._tasks import cancel_and_wait

from .tap import Tap

if TYPE_CHECKING:
    from .clients import Canary

HOST = "127.0.0.1"
ADMIN_TOKEN = "chaos-admin-token"  # the admin API wants at least 8 characters
READY_TIMEOUT_S = 20.0  # a process must answer this soon after start (a loaded 2-core box)
Samples = dict[str, list[tuple[dict[str, str], float]]]  # metric sample name -> (labels, value)


def free_port() -> int:
    """A port nothing listens on now (bound and released; the caller binds it next)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Proc:
    """One ``prefixroute`` process; output appended to ``log_path`` (a restart keeps it)."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_dir / f"{name}.log"
        self.frozen = False
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", "prefixroute.cli", *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.frozen = False

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self._popen is not None
            self._popen.send_signal(sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill9(self) -> None:
        """``kill -9``, then reap it (the port is free when this returns)."""
        if self._popen is not None and self.alive:
            self._popen.kill()
            self._popen.wait(5)
        self.frozen = False

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)
        self.frozen = False

    async def wait_exit(self, timeout_s: float) -> bool:
        """Whether the process ended within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return not self.alive

    def close(self) -> None:
        """Whatever state it is in: thawed, killed, reaped. Safe to call twice."""
        if self.frozen:
            self.thaw()
        self.kill9()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def wait_until(
    session: aiohttp.ClientSession,
    url: str,
    accept: Callable[[int, bytes], bool],
    proc: Proc,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """Poll ``url`` until ``accept(status, body)``; fail with the process's log otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive:
            raise RuntimeError(f"{proc.name} exited ({proc.returncode}):\n{proc.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if accept(resp.status, await resp.read()):
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{proc.name} not ready at {url} in {timeout_s} s:\n{proc.log_tail()}")


def toml_text(settings: Mapping[str, Any], replicas: Iterable[str]) -> str:
    """A gateway config file: flat settings (str, bool, int, float) and the replica list."""
    lines = [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    for url in replicas:
        lines += ["", "[[replicas]]", f"url = {json.dumps(url)}"]
    return "\n".join(lines) + "\n"


class Fleet:
    """N ``prefixroute emulate`` replicas and one ``prefixroute serve`` gateway.

    ``settings``: gateway settings for its TOML file (admin token and port are added).
    ``replica_args``: extra ``prefixroute emulate`` flags. ``tap``: put a :class:`Tap` in front
    of each replica, so the gateway's replica URLs are the taps'.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        replicas: int = 4,
        replica_args: Sequence[str] = (),
        settings: Mapping[str, Any] | None = None,
        tap: bool = False,
    ) -> None:
        self.log_dir = log_dir
        self.n = replicas
        self.replica_args = list(replica_args)
        self.settings = dict(settings or {})
        self.use_tap = tap
        self.replicas: list[Proc] = []
        self.ports: list[int] = []  # each replica's own port
        self.taps: list[Tap] = []
        self.gateway: Proc | None = None
        self.url = ""  # the gateway's base URL
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    @property
    def replica_urls(self) -> list[str]:
        """The replicas as the gateway knows them (the taps' URLs with ``tap``)."""
        if self.taps:
            return [tap.url for tap in self.taps]
        return [f"http://{HOST}:{port}" for port in self.ports]

    def replica_index(self, header: str) -> int | None:
        """Which replica an ``x-prefixroute-replica`` header names: its URL, or the gateway's
        opaque name for it (``r-`` and 8 hex digits of the URL's SHA-256)."""
        for i, url in enumerate(self.replica_urls):
            if header in (url, "r-" + hashlib.sha256(url.encode()).hexdigest()[:8]):
                return i
        return None

    @property
    def gateway_port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def __aenter__(self) -> Fleet:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.n):
            # Distinct: a released port can come back before the process given it binds it (a
            # CI run once gave two replicas one port, and the gateway refused the duplicate).
            port = free_port()
            while port in self.ports:
                port = free_port()
            args = ["emulate", "--host", HOST, "--port", str(port), *self.replica_args]
            self.ports.append(port)
            self.replicas.append(Proc(f"replica{i}", args, self.log_dir))
            self.replicas[-1].start()
        await asyncio.gather(*(self.wait_replica(i) for i in range(self.n)))
        if self.use_tap:
            for port in self.ports:
                self.taps.append(await Tap.start(HOST, port))
        port = free_port()
        while port in self.ports:
            port = free_port()
        self.url = f"http://{HOST}:{port}"
        settings = {"host": HOST, "port": port, "admin_token": ADMIN_TOKEN, **self.settings}
        config = self.log_dir / "gateway.toml"
        config.write_text(toml_text(settings, self.replica_urls))
        self.gateway = Proc("gateway", ["serve", "--config", str(config)], self.log_dir)
        self.gateway.start()

        def all_ready(status: int, body: bytes) -> bool:
            try:
                return status == 200 and json.loads(body).get("ready") == self.n
            except (ValueError, AttributeError):
                return False

        await wait_until(self.session, self.url + "/health", all_ready, self.gateway)

    async def wait_replica(self, i: int) -> None:
        url = f"http://{HOST}:{self.ports[i]}/health"
        await wait_until(self.session, url, lambda status, _: status == 200, self.replicas[i])

    async def restart_replica(self, i: int) -> None:
        """Start replica ``i`` again on its port (after ``kill9``) and wait until it answers."""
        self.replicas[i].start()
        await self.wait_replica(i)

    async def close(self) -> None:
        for proc in [*self.replicas, *([self.gateway] if self.gateway else [])]:
            proc.close()
        for tap in self.taps:
            await tap.stop()
        await self.session.close()

    async def gateway_metrics(self) -> Samples:
        return await scrape(self.session, self.url)

    async def replica_metrics(self, i: int) -> Samples:
        return await scrape(self.session, f"http://{HOST}:{self.ports[i]}")

    async def admin_replicas(self) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with self.session.get(self.url + "/admin/replicas", headers=headers) as resp:
            return list((await resp.json())["replicas"])


async def scrape(session: aiohttp.ClientSession, base_url: str) -> Samples:
    async with session.get(base_url + "/metrics") as resp:
        text = await resp.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def total(samples: Samples, name: str) -> float:
    """The sum of a metric over all its label sets (0 when absent)."""
    return sum(value for _, value in samples.get(name, []))


class EjectionWatcher:
    """Counts ejections: each step of ``prefixroute_replica_healthy{replica}`` from 1 to 0,
    polled every ``interval_s`` (ejections last ``eject_s``, 5 s by default: none is missed)."""

    def __init__(self, fleet: Fleet, interval_s: float = 0.2) -> None:
        self.fleet = fleet
        self.interval_s = interval_s
        self.ejections: list[tuple[float, str]] = []  # (monotonic time, replica)
        self._healthy: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EjectionWatcher:
        await self.poll()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            await self.poll()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                await self.poll()

    async def poll(self) -> None:
        samples = await self.fleet.gateway_metrics()
        for labels, value in samples.get("prefixroute_replica_healthy", []):
            replica = labels.get("replica", "?")
            if self._healthy.get(replica, 1.0) > 0.5 and value < 0.5:
                self.ejections.append((time.monotonic(), replica))
            self._healthy[replica] = value


@dataclass
class Result:
    """One scenario's counts: a row of the table. ``missed`` lists the targets not met."""

    scenario: str
    sent: int = 0
    ok: int = 0
    hung: int = 0  # no answer within the client's (generous) timeout
    lost: int = 0  # dropped, or a stream that ended with neither [DONE] nor an error event
    cut_with_error: int = 0  # a JSON error status or an SSE error event
    before_first_byte: int = 0  # of cut_with_error: nothing relayed before the error
    ejections: int | None = None  # None: not measured
    canary_sent: int = 0
    canary_failures: int | None = None  # None: no canary in this scenario
    notes: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    started: float = field(default_factory=time.monotonic)  # the scenario began (monotonic s)

    def check(self, ok: bool, target: str) -> None:
        if not ok:
            self.missed.append(target)

    def count_canary(self, canary: Canary, target: str) -> None:
        """The canary's column, why its requests failed (in the notes), and ``target`` checked:
        every canary request served."""
        self.canary_sent, self.canary_failures = canary.sent, canary.failures
        if canary.why:
            self.notes.append("canary: " + ", ".join(f"{w} x{n}" for w, n in canary.why.items()))
        self.check(canary.sent > 0 and canary.failures == 0, target)

    def finish(self, watcher: EjectionWatcher | None = None) -> None:
        """The scenario is over: its wall time, and its ejections when ``watcher`` counted them."""
        if watcher is not None:
            self.ejections = len(watcher.ejections)
        self.wall_s = time.monotonic() - self.started

    def row(self) -> str:
        def cell(value: int | None) -> str:
            return "-" if value is None else str(value)

        canary = (
            "-" if self.canary_failures is None else (f"{self.canary_failures}/{self.canary_sent}")
        )
        verdict = "targets met" if not self.missed else "MISSED: " + "; ".join(self.missed)
        notes = "; ".join([verdict, *self.notes])
        cells = [
            self.scenario, str(self.sent), str(self.ok), str(self.hung), str(self.lost),
            str(self.cut_with_error), cell(self.ejections), canary, notes,
        ]  # fmt: skip
        return "| " + " | ".join(cells) + " |"


COLUMNS = (
    "scenario", "sent", "ok", "hung", "lost", "cut with error", "ejections", "canary failures",
    "notes",
)  # fmt: skip
TABLE_HEAD = "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def table(results: Iterable[Result]) -> str:
    return "\n".join([TABLE_HEAD, *(r.row() for r in results)])
