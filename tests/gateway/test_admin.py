"""The admin API: bearer token, list / add / drain / remove, new replicas get traffic at once."""

from __future__ import annotations

from urllib.parse import quote

import aiohttp

from .helpers import ClusterFactory, GatewayFactory, GatewayOf, send, wrong_credentials

TOKEN = "s3cret-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_wrong_or_missing_token_is_401(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN)
    for headers in wrong_credentials(TOKEN):
        async with session.get(gw.url + "/admin/replicas", headers=headers) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "authentication_error"
        async with session.post(
            gw.url + "/admin/replicas", json={"url": "http://127.0.0.1:1"}, headers=headers
        ) as resp:
            assert resp.status == 401
    assert len(gw.registry) == 1


async def test_admin_api_is_absent_without_a_token(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1)
    async with session.get(gw.url + "/admin/replicas", headers=AUTH) as resp:
        assert resp.status == 404


async def test_list_add_drain_remove(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(2)
    first, second = cluster.urls
    gw = await make_gateway([first], admin_token=TOKEN, policy="round_robin")
    api = gw.url + "/admin/replicas"

    async with session.get(api, headers=AUTH) as resp:
        listed = (await resp.json())["replicas"]
    assert [(r["url"], r["status"], r["models"]) for r in listed] == [
        (first, "healthy", ["emulated"])
    ]

    async with session.post(api, json={"url": second + "/"}, headers=AUTH) as resp:
        assert resp.status == 201
        added = (await resp.json())["replica"]
    assert added["url"] == second and added["status"] == "healthy"
    async with session.post(api, json={"url": second}, headers=AUTH) as resp:
        assert resp.status == 409
    async with session.post(api, json={"url": "ftp://x"}, headers=AUTH) as resp:
        assert resp.status == 400

    # The new replica takes traffic from the next request on.
    served = [
        (await send(session, gw.url, "/v1/completions", {"prompt": "a"})).headers[
            "x-prefixroute-replica"
        ]
        for _ in range(4)
    ]
    assert set(served) == {first, second}

    async with session.post(f"{api}/{quote(first, safe='')}/drain", headers=AUTH) as resp:
        assert resp.status == 200
        assert (await resp.json())["replica"]["status"] == "draining"
    for _ in range(3):
        r = await send(session, gw.url, "/v1/completions", {"prompt": "a"})
        assert r.headers["x-prefixroute-replica"] == second

    async with session.delete(f"{api}/{quote(second, safe='')}", headers=AUTH) as resp:
        assert resp.status == 200
    async with session.delete(f"{api}/{quote(second, safe='')}", headers=AUTH) as resp:
        assert resp.status == 404
    async with session.get(api, headers=AUTH) as resp:
        assert [r["url"] for r in (await resp.json())["replicas"]] == [first]
    r = await send(session, gw.url, "/v1/completions", {"prompt": "a"})
    assert r.status == 503  # the only replica left is draining


async def test_a_replica_is_named_by_its_listed_name_too(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """docs/gateway.md: ``{ref}`` is the name the listing shows, or the quoted URL."""
    cluster = await make_cluster(2)
    gw = await make_gateway(cluster.urls, admin_token=TOKEN)
    api = gw.url + "/admin/replicas"
    async with session.get(api, headers=AUTH) as resp:
        names = {r["name"]: r["url"] for r in (await resp.json())["replicas"]}
    assert len(names) == 2 and all(n.startswith("r-") for n in names)
    name, url = sorted(names.items())[0]
    async with session.post(f"{api}/{name}/drain", headers=AUTH) as resp:
        assert resp.status == 200
        assert (await resp.json())["replica"]["url"] == url
    async with session.delete(f"{api}/{name}", headers=AUTH) as resp:
        assert resp.status == 200
    async with session.delete(f"{api}/{name}", headers=AUTH) as resp:
        assert resp.status == 404
    async with session.get(api, headers=AUTH) as resp:
        assert [r["url"] for r in (await resp.json())["replicas"]] == [names[max(names)]]


async def test_a_replica_that_does_not_answer_starts_out(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, admin_token=TOKEN)
    async with session.post(
        gw.url + "/admin/replicas", json={"url": "http://127.0.0.1:9"}, headers=AUTH
    ) as resp:
        assert resp.status == 201
        assert (await resp.json())["replica"]["status"] == "unhealthy"
    for _ in range(3):
        r = await send(session, gw.url, "/v1/completions", {"prompt": "a"})
        assert r.complete and r.headers["x-prefixroute-replica"] == cluster.urls[0]


async def test_a_replica_url_with_v1_is_a_400_that_says_why(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    # An OpenAI base URL copied as is was added: its probes asked /v1/v1/models, it stayed out.
    gw = await gateway_of(1, admin_token=TOKEN)
    async with session.post(
        gw.url + "/admin/replicas", json={"url": "http://127.0.0.1:18001/v1"}, headers=AUTH
    ) as resp:
        assert resp.status == 400
        message = (await resp.json())["error"]["message"]
    assert message == (
        "a replica URL must be http(s)://host[:port] without /v1 (the gateway adds /v1/...), "
        "got 'http://127.0.0.1:18001/v1'"
    )
    assert len(gw.registry) == 1


async def test_a_replica_s_own_speed_priors_from_the_config_and_the_admin_api(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A replica whose operator says it prefills 40,000 tokens/s predicts with that from the
    start: idle beside one at the fleet's 10,000, it gets a long prompt (0.2 s against 0.8 s
    of predicted TTFT), whichever is listed first. The admin API takes the same priors."""
    cluster = await make_cluster(3)
    slow, fast, added = cluster.urls
    gw = await make_gateway(
        [slow, fast], admin_token=TOKEN,
        replica_speeds=(f"{fast}/=prefill_tokens_per_s=40000",),  # written unlike --replica
    )  # fmt: skip
    api = gw.url + "/admin/replicas"
    async with session.get(api, headers=AUTH) as resp:
        speeds = {r["url"]: r["speed"] for r in (await resp.json())["replicas"]}
    priors = {url: s["prior_prefill_tokens_per_s"] for url, s in speeds.items()}
    assert priors == {slow: 10_000.0, fast: 40_000.0}
    assert {url: s["estimates_from"] for url, s in speeds.items()} == {slow: "prior", fast: "given"}
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "word " * 4000})
    assert reply.headers["x-prefixroute-replica"] == fast

    body = {"url": added, "prefill_tokens_per_s": 2_500, "decode_step_s": 0.05}
    async with session.post(api, json=body, headers=AUTH) as resp:
        assert resp.status == 201
        speed = (await resp.json())["replica"]["speed"]
    assert (speed["prior_prefill_tokens_per_s"], speed["prior_decode_step_s"]) == (2_500.0, 0.05)
    for bad in ({"prefill_tokens_per_s": "fast"}, {"prefill_tokens_per_s": 0},
                {"decode_step_s": True}, {"weight": 2}):  # fmt: skip
        async with session.post(api, json={"url": "http://127.0.0.1:9", **bad},
                                headers=AUTH) as resp:  # fmt: skip
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
    assert len(gw.registry) == 3


async def test_speed_priors_for_a_replica_not_configured_are_refused(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    import pytest

    from prefixroute.core import ConfigError

    cluster = await make_cluster(1)
    with pytest.raises(ConfigError, match="not a configured replica"):
        await make_gateway(cluster.urls, replica_speeds=("http://127.0.0.1:9=decode_step_s=0",))
