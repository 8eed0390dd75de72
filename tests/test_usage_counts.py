"""Tests for prefixroute._usage_counts: counts no request can have are no reading."""

from __future__ import annotations

from prefixroute._usage_counts import MAX_TOKENS, Usage, usage_of


def _openai(prompt: object, completion: object, cached: object) -> dict[str, object]:
    return {
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    }


def test_counts_past_any_context_window_are_not_believed() -> None:
    """A replica reporting 1e30 tokens once took the model's learned characters per token to
    its floor and the token counters (which never go down) to 6e30."""
    assert usage_of(_openai(10**30, 10**25, 10**30)) == Usage(None, None, None)
    assert usage_of(_openai(MAX_TOKENS + 1, 5, 0)) == Usage(None, 5, 0)
    assert usage_of(_openai(MAX_TOKENS, 5, 0)) == Usage(MAX_TOKENS, 5, 0)  # the bound is in
    assert usage_of(_openai(-1, 2.5, "3")) == Usage(None, None, None)
    sglang = {"meta_info": {"prompt_tokens": 10**12, "completion_tokens": 3, "cached_tokens": 2}}
    assert usage_of(sglang) == Usage(None, 3, 2)


def test_no_more_cached_than_the_prompt() -> None:
    assert usage_of(_openai(10, 1, 5000)) == Usage(10, 1, 10)
    assert usage_of(_openai(10, 1, 9)) == Usage(10, 1, 9)
    assert Usage(10, 1, 11).cached_tokens == 10
    assert usage_of(_openai(None, 1, 7)) == Usage(None, 1, 7)  # no prompt said: kept as said
