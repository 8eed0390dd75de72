"""Endpoints as the protocol names them, and which of them a pick may name, in what order.

``ip:port`` is the protocol's form of an endpoint; the registry's ids are URLs
(``http://ip:port``). A pick chooses among the registry's candidates, narrowed to the proxy's
subset hint when it sends one (:func:`narrow`) and to the replicas whose context window holds
the request (:func:`eligible`, as ``serve`` does), and may name fallbacks after the primary
(:func:`fallbacks`): the proxy goes down that list when an endpoint fails.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from prefixroute.core import (
    ConfigError,
    NoReplicaAvailable,
    PrefixrouteError,
    ReplicaId,
    RequestView,
    Router,
)
from prefixroute.gateway import ReplicaRegistry, fitting, needed_tokens, normalize_url, pinned


def endpoint_of(rid: ReplicaId) -> str:
    """``http://10.0.0.7:8000`` -> ``10.0.0.7:8000``, the protocol's form."""
    return urlsplit(rid).netloc


def replica_of(endpoint: str) -> ReplicaId:
    """``10.0.0.7:8000`` (or a URL with a port) -> the registry's id; raises ConfigError."""
    rid = normalize_url(endpoint if "://" in endpoint else "http://" + endpoint)
    try:
        port = urlsplit(rid).port
    except ValueError:
        port = None
    if port is None or any(c.isspace() for c in rid):
        raise ConfigError(f"an endpoint must be IP:PORT (or a URL with a port), got {endpoint!r}")
    try:  # the protocol's destination is "<ip:port>": Envoy's ORIGINAL_DST resolves no name,
        ipaddress.ip_address(urlsplit(rid).hostname or "")  # and answered every pick 503
    except ValueError:
        raise ConfigError(
            f"an endpoint must be IP:PORT, an address and not a name, got {endpoint!r} (list "
            "pods with --k8s-selector, or resolve the name first)"
        ) from None
    return rid


def fallbacks(
    router: Router,
    view: RequestView,
    now: float,
    candidates: Sequence[ReplicaId],
    primary: ReplicaId,
    n: int,
) -> list[ReplicaId]:
    """Up to ``n`` replicas after ``primary``, best first: each one the policy's own choice
    among the ``candidates`` not yet named (``Router.explain``: nothing recorded, no turn or
    random draw used up), so the ranking is the policy's, not a second one."""
    rest = [rid for rid in candidates if rid != primary]
    out: list[ReplicaId] = []
    while rest and len(out) < n:
        chosen = router.explain(view, now, rest).replica
        out.append(chosen)
        rest.remove(chosen)
    return out


def narrow(candidates: Sequence[ReplicaId], subset: Sequence[str] | None) -> list[ReplicaId]:
    """``candidates`` within the proxy's subset hint (all of them without one); raises
    NoReplicaAvailable when the hint leaves none, as the protocol wants (503)."""
    if subset is None:
        return list(candidates)
    allowed, hosts = set(), set()
    for endpoint in subset:
        try:
            allowed.add(_same_address(replica_of(endpoint.strip())))
        except PrefixrouteError:
            host = _bare_ip(endpoint)
            if host is not None:  # an IP without a port: every endpoint at that IP, as the
                hosts.add(host)  # reference picker matches a hint (it compares IPs only)
            # else a malformed entry is just not eligible
    narrowed = [
        rid for rid in candidates if (at := _same_address(rid)) in allowed or at[0] in hosts
    ]
    if not narrowed:
        raise NoReplicaAvailable(
            f"none of the {len(subset)} endpoints of the proxy's subset hint is eligible"
        )
    return narrowed


def _bare_ip(entry: str) -> str | None:
    """``entry`` as :func:`_same_address` writes a host, when it is an IP alone (IPv6 bare or
    bracketed); else None."""
    text = entry.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text)).lower()
    except ValueError:
        return None


def _same_address(rid: ReplicaId) -> tuple[str, int | None]:
    """``rid``'s host and port as one address compares equal however it is written: an IP
    in its canonical form (``[fd00:0::7]`` is ``[fd00::7]``), the port a number (``08000`` is
    8000). Envoy and Kubernetes send canonical forms; a hint written otherwise matched
    nothing (an outside audit, 2026-12-06)."""
    parts = urlsplit(rid)
    host = parts.hostname or ""
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host))
    try:
        port = parts.port
    except ValueError:
        port = None
    return host.lower(), port


def eligible(
    registry: ReplicaRegistry,
    view: RequestView,
    subset: Sequence[str] | None,
    owner: ReplicaId | None = None,
) -> list[ReplicaId]:
    """The registry's candidates for ``view`` within the proxy's subset hint (:func:`narrow`)
    whose context window holds it (``gateway._context_window.fitting``); only ``owner``
    where a stored response names one (``gateway.pinned``)."""
    # The hint and the owner narrow the ready replicas, before the cap: replicas that are up
    # but full make a request to shed (Overloaded, the protocol's 429), not "none eligible"
    # or "not available" (503).
    candidates = registry.with_room(pinned(owner, narrow(registry.ready(view.model), subset)))
    return fitting(registry, candidates, needed_tokens(view))
