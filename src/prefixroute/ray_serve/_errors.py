"""The one error the Ray Serve router raises on purpose.

A request the router cannot read must fail fast with a message, never wait: Ray retries
``choose_replicas`` with backoff for as long as it returns no replica, and logs and restarts a
routing task that raises. So the router sets this exception on the request's future, and the
caller of the deployment handle gets it instead of a hang.
"""

from __future__ import annotations

from prefixroute.core import InvalidPrompt


class UnroutableRequest(InvalidPrompt):
    """No argument of a request carries ``messages`` or ``prompt`` (attribute or key), or the
    one that does cannot be keyed (the core's ``InvalidPrompt``, translated here).

    A ``ValueError`` too (as ``InvalidPrompt`` is), as Ray's own PrefixCacheAffinityRouter
    raises for the same request.
    """
