"""The ``sync_redis`` URL: checked at start, and shown without its password.

A URL redis-py cannot use fails only when the sync first connects, long after the gateway
said it was serving: a port that is not a number or a broken IPv6 host raised from the
client's constructor and ended the sync's tasks unseen, and an option redis-py does not know
(``?foo=bar``) raised at every connect, a traceback every 2 s. Redis *down* is no error (the
sync retries in the background), but a URL that can never work is a setting's mistake, so
:func:`check_url` builds the connection redis-py would build, without connecting, and the
config checks (``GatewayConfig``, the Ray router's settings) call it: one line, exit 2.

A URL may carry a password (``redis://:PASSWORD@host/0``); :func:`redacted` is the form for
the logs.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from redis.asyncio.connection import ConnectionPool

from prefixroute.core import ConfigError

SCHEMES = ("redis://", "rediss://", "unix://")


def check_url(url: str) -> None:
    """Raise ``ConfigError`` (naming ``sync_redis``) unless redis-py can connect with ``url``
    as it stands; nothing is sent anywhere."""
    shown = redacted(url)
    if not url.startswith(SCHEMES):
        raise ConfigError(f"sync_redis must be a redis:// URL, got {shown!r}")
    try:
        parts = urlsplit(url)
        pool = ConnectionPool.from_url(url)
        pool.make_connection()  # type: ignore[no-untyped-call]  # ?options fail here
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"sync_redis {shown!r} is not a usable Redis URL: {exc}") from None
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"sync_redis {shown!r} names no socket path")
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        # redis-py would silently use database 0.
        raise ConfigError(f"sync_redis {shown!r}: the database must be a number, got {db!r}")


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: in the userinfo, in a
    ``?password=`` option (redis-py takes both), and a ``#fragment`` whole (a password with a
    ``#`` in it splits there)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # unparseable (a broken IPv6 host): drop any userinfo whole
        password = None
        parts = None
    if parts is None or "@" in parts.fragment:  # no parts, or a '#' inside the userinfo
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url
    netloc = parts.netloc
    if password:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(
        f"{item.partition('=')[0]}=***" if item.partition("=")[0].lower() == "password" else item
        for item in parts.query.split("&")
    )
    fragment = "***" if parts.fragment else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment))
