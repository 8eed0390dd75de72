"""``prefixroute serve`` as a user runs it: a real process, stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp

from .helpers import read_until, send


async def test_serve_without_replicas_starts_emulated_ones() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prefixroute.cli", "serve", "--port", "0", "--emulate", "2",
        "--emulate-time-scale", "0.01", "--admin-token", "t0ken-t0ken",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            await read_until(proc.stderr, r"started 2 emulated replicas", seen)
            url = (await read_until(proc.stderr, r"gateway serving (http://\S+)", seen)).group(1)
            async with aiohttp.ClientSession() as session:
                reply = await send(session, url, "/v1/completions", {"prompt": "hello world"})
                assert reply.complete, reply
                async with session.get(
                    url + "/admin/replicas", headers={"Authorization": "Bearer t0ken-t0ken"}
                ) as resp:
                    assert len((await resp.json())["replicas"]) == 2
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
            rest = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "hello world" not in "".join(seen) + rest  # no prompt text in the logs


async def test_serve_rejects_bad_settings() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prefixroute.cli", "serve", "--read-timeout", "0",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"read_timeout_s" in err
