"""A replica's URL as the gateway names it: the one check of every replica URL it is given."""

from __future__ import annotations

from urllib.parse import urlsplit

from prefixroute.core import ConfigError, ReplicaId


def normalize_url(url: str) -> ReplicaId:
    """``http(s)://host:port[/prefix]`` without a trailing slash; raises ConfigError.

    The one check of a replica URL: ``--replica``, the config file, the admin API and the
    picker's endpoints all come here. A prefix (a replica behind a path-routing proxy) is
    kept; a ``/v1`` in the path is refused, as the gateway adds ``/v1/...`` itself: an OpenAI
    base URL copied as is made every probe ask ``/v1/v1/models``, and every request a 503."""
    shape = f"a replica URL must be http(s)://host[:port][/prefix], got {url!r}"
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # "http://[::1": a broken IPv6 host was a traceback, or a 500 (admin)
        raise ConfigError(shape) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(shape)
    if parts.query or parts.fragment:
        raise ConfigError(f"a replica URL takes no query or fragment: {url!r}")
    # Credentials in the URL would be the replica's id: in logs, the admin API and the labels
    # of an unauthenticated /metrics (the upstream key goes by --upstream-api-key-file).
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"a replica URL takes no user or password (user@host): {url!r}")
    try:
        port = parts.port  # urlsplit checks it (a number, 0-65535) only when asked: 99999 raises
    except ValueError:
        port = 0
    if port == 0:
        raise ConfigError(f"a replica URL's port must be 1-65535: {url!r}")
    if "v1" in parts.path.lower().split("/"):
        raise ConfigError(
            "a replica URL must be http(s)://host[:port] without /v1 (the gateway adds "
            f"/v1/...), got {url!r}"
        )
    netloc = parts.netloc.lower()
    return ReplicaId(f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}")
