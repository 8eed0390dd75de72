"""The routing key of a Serve request, found in its arguments where Ray's prefix router looks.

Ray's ``PrefixCacheAffinityRouter`` takes the first positional argument that has a ``messages``
or a ``prompt`` attribute (Ray LLM's request models have them). We look in the same place, so
one deployment runs under either router unchanged, and also accept a mapping with those keys
(a plain JSON body passed through a handle) and keyword arguments after the positional ones.

The key itself is the core's, the one the gateway and the endpoint picker use
(:mod:`prefixroute.core.request_key`): chat messages in order, roles included, one
``"role: content\\n"`` per message, so a conversation's next turn extends the previous turn's
key block for block; a prompt string is its own key; a prompt of token ids is routed on the
ids; of a batch of prompts the first decides. Ray's router drops the roles; we keep them,
because two conversations that differ only in who said what are different prefixes to the
engine's chat template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixroute.core import Endpoint, InvalidPrompt, RouteKey, key_of
from prefixroute.core.prompt_key import field_of
from prefixroute.ray_serve._errors import UnroutableRequest

__all__ = ["RouteKey", "route_key"]  # RouteKey is the core's, named here for the ledger

# Looked up in this order, in each argument (as Ray does), with the endpoint each one means.
FIELDS = (("messages", Endpoint.CHAT), ("prompt", Endpoint.COMPLETIONS))


def route_key(args: Sequence[object], kwargs: Mapping[str, object]) -> RouteKey:
    """The key of the first argument with ``messages`` or ``prompt``; raises UnroutableRequest."""
    for arg in (*args, *kwargs.values()):
        for name, endpoint in FIELDS:
            found, value = field_of(arg, name)
            if not found or value is None:  # a request model may carry both, one left None
                continue
            try:
                return key_of(endpoint, arg)
            except InvalidPrompt as exc:
                raise UnroutableRequest(f"prefixroute: {exc}") from None
    raise UnroutableRequest(
        "prefixroute: no argument of this request has 'messages' or 'prompt' (as an attribute "
        "or a key), so there is nothing to route on; pass the request object (or a dict) that "
        "carries them as an argument of the handle call"
    )
