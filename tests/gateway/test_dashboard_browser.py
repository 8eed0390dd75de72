"""The fleet page in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

While ``bench``'s replay drives traffic through a gateway in front of emulated replicas, the
page must load, its numbers must change, and the admin token must hold (no page, no state
without it). The last frame is saved as ``dashboard.png`` under ``$PREFIXROUTE_ARTIFACTS_DIR``
(default ``.cache/artifacts/``, which CI keeps: ``.ci/run`` links ``.cache`` to its cache
folder).

Playwright drives the system browser (``executable_path``); ``playwright install`` is never
run: it downloads browsers, and CI machines have no network for that. Without chromium or
playwright the test skips, unless ``PREFIXROUTE_BROWSER_REQUIRED=1`` (``.ci/run`` sets it and
installs both): then it fails, as the Redis, vLLM and Ray tests do.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prefixroute.bench import ReplayConfig, replay
from prefixroute.emulate import EmulatorConfig
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload

from .helpers import ClusterFactory, GatewayFactory, send

CHROMIUM = Path(os.environ.get("PREFIXROUTE_CHROMIUM", "/usr/bin/chromium"))
REQUIRED = os.environ.get("PREFIXROUTE_BROWSER_REQUIRED") == "1"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("PREFIXROUTE_ARTIFACTS_DIR", ROOT / ".cache" / "artifacts"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
TOKEN = "browser-admin-token"
# Replicas at a fifth of real time: requests last long enough to be seen in flight.
REPLICA = EmulatorConfig(ReplicaConfig(block_size=16), time_scale=0.2)


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (the dev extras)"
    return None


@pytest.fixture
def browser_ready() -> None:
    missing = _missing()
    if missing is not None:
        if REQUIRED:
            pytest.fail(f"{missing}, and PREFIXROUTE_BROWSER_REQUIRED=1")
        pytest.skip(missing)


async def _number(page: Any, selector: str) -> int:
    text = await page.text_content(selector)
    digits = re.sub(r"[^0-9]", "", text or "")
    return int(digits) if digits else -1


async def test_dashboard_in_chromium_updates_under_traffic_and_needs_the_token(
    browser_ready: None,
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import async_playwright, expect

    cluster = await make_cluster(3, REPLICA)
    gw = await make_gateway(cluster.urls, admin_token=TOKEN)
    page_url = gw.url + "/dashboard"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # No credentials, or the wrong token: the page challenges (Basic), the browser has
            # nothing that passes; no answer but 401s, and the state document is a 401 too.
            for credentials in (None, {"username": "admin", "password": "wrong-token-0"}):
                context = await browser.new_context(http_credentials=credentials)  # type: ignore[arg-type]
                page = await context.new_page()
                served: list[str] = []  # anything the server let through
                page.on("response", lambda r, seen=served: seen.append(r.url) if r.ok else None)
                try:  # Chromium shows the 401, or gives up on the credentials: either way
                    response = await page.goto(page_url)
                    assert response is not None and response.status == 401
                except PlaywrightError as exc:
                    assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
                await asyncio.sleep(1.5)  # past a poll, had the page's script run at all
                assert served == []
                for path in ("/dashboard", "/dashboard/state.json"):
                    assert (await page.request.get(gw.url + path)).status == 401
                await context.close()

            # The token as the Basic password: the page loads and goes live.
            context = await browser.new_context(
                http_credentials={"username": "admin", "password": TOKEN},
                viewport={"width": 1400, "height": 1100},
            )
            page = await context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on(
                "console",
                lambda msg: problems.append(msg.text) if msg.type == "error" else None,
            )
            response = await page.goto(page_url)
            assert response is not None and response.status == 200
            await expect(page.locator("#status")).to_have_text("live", timeout=10_000)
            assert await page.locator("#replicas tbody tr").count() == 3
            assert await _number(page, "#requests-total") == 0
            # No replica has taught the router its speed yet: every rate is marked.
            rates = page.locator("#replicas tbody td.rate")
            assert all(t.endswith("*") for t in await rates.all_text_contents())

            # One request: the page shows it at its next poll (once a second).
            body = {"messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 4}
            assert (await send(session, gw.url, "/v1/chat/completions", body)).status == 200
            sent = time.monotonic()
            await expect(page.locator("#requests-total")).to_have_text("1", timeout=5_000)
            print(f"dashboard showed a request {time.monotonic() - sent:.2f} s after its answer")

            # bench's replay drives traffic: the numbers move while it runs.
            workload = make_workload("shared-prefix", 0, {
                "num_groups": 3, "prompts_per_group": 10, "system_prompt_len": 512,
                "question_len": 32, "output_len": 48, "rate": 6.0,
            })  # fmt: skip
            traffic = asyncio.create_task(
                replay(workload, ReplayConfig(gw.url, time_scale=1.0), "browser")
            )
            seen: set[int] = set()
            in_flight_seen = 0
            while not traffic.done():
                seen.add(await _number(page, "#requests-total"))
                in_flight_seen = max(in_flight_seen, await _number(page, "#in-flight-total"))
                await asyncio.sleep(0.5)
            result = await traffic
            assert not result.errors, result.errors[:3]
            assert len(seen) >= 3, seen  # the count changed at least twice during the run
            assert in_flight_seen > 0  # requests were seen in flight
            await expect(page.locator("#requests-total")).to_have_text("31", timeout=5_000)
            # 31 requests on 3 replicas: at least one was timed often enough to be learned.
            assert any(not t.endswith("*") for t in await rates.all_text_contents())
            decisions = page.locator("#decisions tbody tr")
            assert await decisions.count() > 10
            reasons = await page.locator("#decisions td.reason").all_text_contents()
            assert "prefix_match" in reasons
            hit = await page.text_content("#hit-actual")
            assert hit is not None and hit.endswith("%") and float(hit[:-1]) > 50
            lines = page.locator("#chart-rate polyline")
            assert await lines.count() >= 1
            assert await page.locator("#chart-inflight polyline").count() == 3
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            await page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            assert shot.stat().st_size > 10_000
            assert not problems, problems  # no script errors, no CSP violations
            await context.close()
        finally:
            await browser.close()
