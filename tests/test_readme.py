"""The README runs: every command in its code blocks is run here, in short form (issue 14).

A command is a code-block line (indented four spaces) that starts with ``make``,
``.venv/bin/prefixroute``, ``prefixroute`` or ``curl``; ``\\`` continues it. Short form:

- ``make TARGET`` is checked with ``make -n TARGET`` (the target exists and its recipe expands;
  ``make test`` cannot run inside the tests it runs).
- ``prefixroute serve ... &`` is started on a free port, with any replica that is not on this
  machine replaced by a local emulated one; the block's ``curl`` lines then run against it, and
  must get the reason header and ``cached_tokens`` the README shows.
- Any other ``prefixroute`` command runs as written and must exit 0.

So a renamed flag, a removed subcommand or a changed header breaks this test, not a newcomer.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMAND = re.compile(r"^(make|\.venv/bin/prefixroute|prefixroute|curl)\s")
PREFIXROUTE = [sys.executable, "-m", "prefixroute.cli"]
TIMEOUT_S = 180


def code_blocks(text: str) -> list[list[str]]:
    """The commands of each indented code block, continuation lines joined."""
    blocks: list[list[str]] = []
    current: list[str] = []
    pending = ""
    for line in [*text.splitlines(), ""]:
        if line.startswith("    ") and not line.startswith("     ") or pending:
            body = line[4:] if line.startswith("    ") else line.strip()
            if pending:
                body = pending + " " + body.strip()
                pending = ""
            if body.rstrip().endswith("\\"):
                pending = body.rstrip()[:-1].rstrip()
                continue
            if COMMAND.match(body):
                current.append(re.sub(r"\s+#\s.*$", "", body.strip()))  # no trailing comment
            continue
        if current and line.strip() == "":
            blocks.append(current)
            current = []
    return blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def argv_of(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    if words and words[-1] == "&":
        words = words[:-1]
    assert words[0] in (".venv/bin/prefixroute", "prefixroute"), command
    return [*PREFIXROUTE, *words[1:]]


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never became healthy")


@contextmanager
def running(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` as a background process, its output in a temporary file, stopped on exit."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        except BaseException:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
            raise
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def local_replicas(count: int) -> Iterator[list[str]]:
    """``count`` emulated replicas in one ``prefixroute emulate`` process, on consecutive free
    ports: another process can take one between the check and the bind, so a start that
    fails is retried on other ports."""
    if not count:
        yield []
        return
    for _ in range(5):
        port = free_port()
        if any(_taken(port + i) for i in range(count)):
            continue
        with running([*PREFIXROUTE, "emulate", "--port", str(port), "--count", str(count)]) as proc:
            urls = [f"http://127.0.0.1:{port + i}" for i in range(count)]
            if all(_became_healthy(url, proc) for url in urls):
                yield urls
                return
    raise AssertionError(f"could not start {count} emulated replicas on consecutive ports")


def _became_healthy(url: str, proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``url`` answers /health; False when the process exited (its port was taken)."""
    try:
        wait_healthy(url, proc)
    except AssertionError:
        if proc.poll() is None:
            raise  # alive but never healthy: a real failure
        return False
    return True


def _taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def serve_short(argv: list[str]) -> tuple[list[str], int, int]:
    """``argv`` on a free port with remote replicas to be replaced: (argv, port, remotes)."""
    out: list[str] = []
    remotes = 0
    port = free_port()
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--port":
            out += [flag, str(port)]
            i += 2
        elif flag == "--replica" and not is_local(argv[i + 1]):
            out += [flag, f"{{replica{remotes}}}"]
            remotes += 1
            i += 2
        else:
            out.append(flag)
            i += 1
    return out, port, remotes


def run_serve_block(serve: str, curls: list[str]) -> None:
    argv, port, remotes = serve_short(argv_of(serve))
    with local_replicas(remotes) as urls:
        argv = [a.format(**{f"replica{k}": u for k, u in enumerate(urls)}) for a in argv]
        with running(argv) as proc:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, proc)
            outputs = []
            for c in curls:
                words = shlex.split(re.sub(r"(127\.0\.0\.1|localhost):\d+", f"127.0.0.1:{port}", c))
                done = subprocess.run(words, cwd=ROOT, capture_output=True, timeout=60)
                assert done.returncode == 0, (c, done.stderr.decode())
                outputs.append(done.stdout.decode())
    for out in outputs:
        # What the README shows a newcomer: the routing headers and the replica's usage.
        assert re.search(r"(?im)^x-prefixroute-reason: \w+", out), out
        assert '"cached_tokens"' in out, out


def run_block(block: list[str]) -> int:
    """Runs one block's commands in short form; returns how many were run."""
    serve = [c for c in block if " serve" in c and c.split()[0].endswith("prefixroute")]
    curls = [c for c in block if c.startswith("curl")]
    if serve:
        assert len(serve) == 1, block
        run_serve_block(serve[0], curls)
    else:
        assert not curls, f"a curl with no server started in its block: {block}"
    for c in block:
        if c in serve or c in curls:
            continue
        if c.startswith("make"):
            target = shlex.split(c)[1:]
            done = subprocess.run(["make", "-n", *target], cwd=ROOT, capture_output=True)
        else:
            env = {**os.environ, "COLUMNS": "100"}
            done = subprocess.run(
                argv_of(c), cwd=ROOT, capture_output=True, timeout=TIMEOUT_S, env=env
            )
        assert done.returncode == 0, (c, done.stderr.decode()[-2000:])
    return len(block)


BLOCKS = code_blocks(README.read_text())


def test_the_readme_has_runnable_commands() -> None:
    commands = [c for b in BLOCKS for c in b]
    assert any(c.startswith("curl") for c in commands)  # the quickstart
    assert commands[:2] == ["make demo", "make test"]  # the README's first lines
    assert len(commands) >= 8


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b[0][:60])
def test_every_readme_command_runs(block: list[str]) -> None:
    assert run_block(block) == len(block)
