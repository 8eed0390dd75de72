"""Asking vLLM to report a request's cached prefix again, while a replica's KV events are lost.

vLLM publishes a ``BlockStored`` only for the blocks it newly caches (``BlockPool``'s
``cache_full_blocks``). A batch lost without a replay socket (vLLM's first batch after start
usually is: docs/vllm.md) leaves the prefixes first stored in it unknown for as long as the
engine keeps them cached, and every block later stored under them an orphan the index cannot
place: a shared system prompt was never learned again (an outside audit, 2026-12-07). vLLM 0.32
reports a request's cached prefix again, from its root, when the request asks for it
(``vllm_xargs: {"kv_cache_report_mode": "full"}``, read into the request's ``extra_args``:
``vllm/v1/core/kv_cache_manager.py``). So while a followed stream is ``resyncing`` the gateway
asks that of every chat, completion and Messages request (the bodies vLLM takes ``vllm_xargs``
in); a client's own ``kv_cache_report_mode`` is left as it is. The reports of blocks the index
already holds cost the indexer a lookup each (``events/_indexer.py``).
"""

from __future__ import annotations

from prefixroute.core import Endpoint

REPORTING = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.MESSAGES})


def ask_full_report(endpoint: Endpoint, obj: object) -> bool:
    """Set ``vllm_xargs.kv_cache_report_mode = "full"`` in the parsed body ``obj`` (in place);
    False where left alone: another endpoint, a body that is no object, ``vllm_xargs`` that is
    no object (the replica's to refuse), or a client that chose a mode."""
    if endpoint not in REPORTING or not isinstance(obj, dict):
        return False
    xargs = obj.get("vllm_xargs")
    if xargs is None:
        obj["vllm_xargs"] = {"kv_cache_report_mode": "full"}
        return True
    if not isinstance(xargs, dict) or "kv_cache_report_mode" in xargs:
        return False
    xargs["kv_cache_report_mode"] = "full"
    return True
