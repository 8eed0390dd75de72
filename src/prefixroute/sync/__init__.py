"""Several router instances, one view: routing decisions and load shared through Redis.

A gateway (``prefixroute serve --sync-redis URL``), an endpoint picker (``prefixroute epp
--sync-redis URL``) and the Ray Serve router each run a :class:`RouteSync` beside their
``Router``: it publishes every decision, first token and end, and applies the other instances'
to the router, on one channel with one message format, so gateways and pickers can share a
channel. How and why: ``_redis.py``'s docstring.

    sync = RouteSync("redis://127.0.0.1:6379", "prefixroute", router, registry)
    await sync.start()
    sync.routed(view, decision)   # after Router.route; never blocks
"""

from prefixroute.sync._redis import RouteSync
from prefixroute.sync._signing import SECRET_ENV
from prefixroute.sync._url import check_url, redacted

__all__ = ["SECRET_ENV", "RouteSync", "check_url", "redacted"]
