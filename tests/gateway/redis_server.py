"""A real ``redis-server`` for the sync tests: loopback, a free port, no persistence.

Without ``redis-server`` on the PATH the tests that need one skip, unless
``PREFIXROUTE_REDIS_REQUIRED=1`` (set by ``.ci/run``, which installs it): then they fail, as the
vLLM and Ray tests do under their own switches.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
REQUIRED = os.environ.get("PREFIXROUTE_REDIS_REQUIRED") == "1"
MISSING = "redis-server not installed (Debian: apt-get install -y redis-server)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1; ``stop`` and ``start`` again keep the port."""

    def __init__(self, workdir: Path) -> None:
        if REDIS_SERVER is None:
            if REQUIRED:
                pytest.fail(f"{MISSING}, and PREFIXROUTE_REDIS_REQUIRED=1")
            pytest.skip(MISSING)
        self.binary = REDIS_SERVER
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        """Start it (again), with ``extra`` options (``--requirepass PW``)."""
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(self.workdir), *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):  # up, maybe locked
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()  # as a crash would: no goodbye to the clients
            proc.wait(timeout=10)
