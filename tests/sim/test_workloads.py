"""Tests of src/prefixroute/sim/workloads: determinism, the article's examples, replay fidelity."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixroute.core import ConfigError
from prefixroute.sim import workloads
from prefixroute.sim.workload import Session, TokenArray, Workload
from prefixroute.sim.workloads import (
    UnknownWorkload,
    make_workload,
    workload_names,
    workload_params,
)
from prefixroute.sim.workloads._data import data_file, shared_data_dir
from prefixroute.sim.workloads._text import WordTokenizer

NAMES = [
    "seed-conversation",
    "seed-shared-prompt",
    "multi-turn",
    "shared-prefix",
    "hot-prefix",
    "no-sharing",
    "mooncake",
    "dialogues",
]
# Smaller versions for the determinism checks, so the suite stays quick.
SMALL: dict[str, dict[str, str]] = {
    "multi-turn": {"sessions": "40"},
    "shared-prefix": {"num_groups": "4", "prompts_per_group": "5"},
    "hot-prefix": {"requests": "100"},
    "no-sharing": {"requests": "100"},
    "mooncake": {"limit": "200"},
    "dialogues": {"sessions": "60"},
}
DATA = shared_data_dir()
needs_traces = pytest.mark.skipif(
    not (DATA / "traces").is_dir(), reason="shared Mooncake traces not present"
)
needs_chat = pytest.mark.skipif(not (DATA / "chat").is_dir(), reason="shared hh-rlhf not present")
SKIPS = {"mooncake": needs_traces, "dialogues": needs_chat}


def each_name() -> list[object]:
    return [pytest.param(n, marks=SKIPS[n]) if n in SKIPS else n for n in NAMES]


def fingerprint(w: Workload) -> str:
    """A digest of everything a simulator would see."""
    h = hashlib.sha256()
    for s in w.sessions:
        h.update(repr((s.session_id, s.start_s, s.tenant)).encode())
        for t in s.turns:
            h.update(t.tokens.tobytes())
            h.update(repr((t.output_tokens, t.think_s, t.text)).encode())
    h.update(repr(w.cluster_events).encode())
    return h.hexdigest()


def is_prefix(a: TokenArray, b: TokenArray) -> bool:
    return len(a) < len(b) and bool(np.array_equal(a, b[: len(a)]))


def test_registry_names() -> None:
    assert workload_names() == NAMES
    assert set(workloads.__all__) <= set(dir(workloads))


@pytest.mark.parametrize("name", NAMES)
def test_params_have_types_defaults_and_help(name: str) -> None:
    params = workload_params(name)
    assert params
    for key, (kind, default, doc) in params.items():
        assert kind in (int, float, str, bool), key
        assert type(default) is kind, key
        assert doc, f"{name}.{key} has no help"


@pytest.mark.parametrize("name", each_name())
def test_deterministic_under_seed(name: str) -> None:
    small = SMALL.get(name, {})
    a = make_workload(name, seed=3, overrides=small)
    b = make_workload(name, seed=3, overrides=small)
    c = make_workload(name, seed=4, overrides=small)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(c)


@pytest.mark.parametrize("name", each_name())
def test_default_workload_is_well_formed(name: str) -> None:
    w = make_workload(name)
    assert w.name == name and w.description
    assert w.block_size == (1 if name.startswith("seed-") else 16)
    if not name.startswith("seed-"):
        assert 1000 <= w.num_requests <= 5000
    starts = [s.start_s for s in w.sessions]
    assert min(starts) >= 0
    for s in w.sessions:
        for t in s.turns:
            assert t.tokens.dtype == np.uint32 and len(t.tokens) > 0 and t.output_tokens >= 1
            assert not t.tokens.flags.writeable
        for prev, nxt in zip(s.turns, s.turns[1:], strict=False):
            assert is_prefix(prev.tokens, nxt.tokens)
            assert nxt.think_s >= 0


def test_seed_conversation_is_the_articles() -> None:
    w = make_workload("seed-conversation")
    [session] = w.sessions
    turns = session.turns
    assert [len(t.tokens) for t in turns] == [400, 700, 1000, 1400, 1700]
    assert [t.output_tokens for t in turns] == [100, 100, 150, 100, 100]
    assert all(is_prefix(a.tokens, b.tokens) for a, b in zip(turns, turns[1:], strict=False))
    # All content is distinct, so token-exact reuse is exactly the previous prompt.
    assert len(np.unique(turns[-1].tokens)) == 1700
    reused = sum(len(t.tokens) for t in turns[:-1])
    assert (reused, 5200 - reused) == (3500, 1700)
    assert w.block_size == 1 and turns[1].think_s == 1.0


def test_seed_shared_prompt_shares_exactly_the_system_prompt() -> None:
    w = make_workload("seed-shared-prompt")
    prompts = [s.turns[0].tokens for s in w.sessions]
    assert len(prompts) == 50 and all(len(s.turns) == 1 for s in w.sessions)
    assert all(np.array_equal(p[:200], prompts[0][:200]) for p in prompts)
    assert len({int(p[200]) for p in prompts}) == 50  # the 201st token differs for everyone
    assert [s.start_s for s in w.sessions[:3]] == pytest.approx([0.0, 0.01, 0.02])


def _trace_rows(trace: str, n: int) -> list[dict[str, object]]:
    with (DATA / "traces" / f"{trace}_trace.jsonl").open() as f:
        return [json.loads(line) for _, line in zip(range(n), f, strict=False)]


@needs_traces
@pytest.mark.parametrize("trace", ["conversation", "synthetic"])
def test_mooncake_preserves_prefix_sharing(trace: str) -> None:
    n, bt = 300, 32
    rows = _trace_rows(trace, n)
    w = make_workload("mooncake", overrides={"trace": trace, "limit": str(n)})
    tokens = {int(s.session_id.removeprefix("row")): s.turns[0].tokens for s in w.sessions}
    assert sorted(tokens) == list(range(n))
    # Over full blocks: equal id prefixes <=> equal token prefixes, at every depth k.
    by_ids: dict[tuple[int, ...], set[bytes]] = {}
    by_tokens: dict[bytes, set[tuple[int, ...]]] = {}
    for i, row in enumerate(rows):
        ids = [int(x) for x in row["hash_ids"]]  # type: ignore[attr-defined]
        toks = tokens[i]
        assert len(toks) == math.ceil(int(str(row["input_length"])) * bt / 512)
        for k in range(1, len(toks) // bt + 1):
            key, content = tuple(ids[:k]), toks[: k * bt].tobytes()
            by_ids.setdefault(key, set()).add(content)
            by_tokens.setdefault(content, set()).add(key)
    assert all(len(v) == 1 for v in by_ids.values())
    assert all(len(v) == 1 for v in by_tokens.values())
    assert any(len(k) > 1 for k in by_ids)  # the check covered deep prefixes too


@needs_traces
def test_mooncake_copies_repeat_the_trace_without_sharing_across_copies() -> None:
    n = 100
    one = make_workload("mooncake", overrides={"limit": str(n)})
    two = make_workload("mooncake", overrides={"limit": str(n), "copies": "2"})
    assert two.num_requests == 2 * n
    tokens = {int(s.session_id.removeprefix("row")): s.turns[0].tokens for s in two.sessions}
    first = {int(s.session_id.removeprefix("row")): s.turns[0].tokens for s in one.sessions}
    for i in range(n):
        assert np.array_equal(tokens[i], first[i])  # copy 0 is the trace itself
        assert len(tokens[n + i]) == len(tokens[i])
    # Requests share their first block within a copy (a shared system prompt), never across.
    heads = [{tokens[c * n + i][:32].tobytes() for i in range(n)} for c in (0, 1)]
    assert heads[0].isdisjoint(heads[1])
    assert len(heads[0]) < n and len(heads[1]) == len(heads[0])


def test_mooncake_explicit_path_scales_lengths(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 100, "hash_ids": [7, 8]},
        {"timestamp": 3000, "input_length": 600, "output_length": 3, "hash_ids": [7, 9]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = {"path": str(path), "block_tokens": "16", "jitter_s": "0", "time_scale": "0.5"}
    w = make_workload("mooncake", overrides=over)
    a, b = (s.turns[0] for s in w.sessions)
    assert (len(a.tokens), len(b.tokens)) == (32, 19)  # ceil(1000/32), ceil(600/32)
    assert (a.output_tokens, b.output_tokens) == (3, 1)  # round(100/32), at least 1
    assert np.array_equal(a.tokens[:16], b.tokens[:16]) and a.tokens[16] != b.tokens[16]
    assert [s.start_s for s in w.sessions] == [0.0, 1.5]


GOOD_ROW = '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}'


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"timestamp": 5, "input_length": 100, "output_length": 10}', "line 2: no hash_ids"),
        ('{"hash_ids": [1], "input_length": 100}', "line 2: no output_length, timestamp"),
        ("[1, 2, 3]", "line 2: not an object"),
        ('{"timestamp": 0, "input_length": 1', "line 2: not JSON"),
        ('{"timestamp": 0, "input_length": 4834.5, "output_length": 1, "hash_ids": [1]}',
         "line 2: input_length and output_length must be whole numbers"),
        ('{"timestamp": "soon", "input_length": 1, "output_length": 1, "hash_ids": [1]}',
         "line 2: .*timestamp a number"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}',
         "line 2: hash_ids must be a list of whole numbers"),
    ],
)  # fmt: skip
def test_a_trace_row_that_is_no_request_is_one_error_naming_its_line(
    tmp_path: Path, bad: str, message: str
) -> None:
    """A missing field, a length that is no whole number, a row that is no object: each was a
    KeyError, ValueError or TypeError traceback, and a line that was no JSON was reported at
    "line 1" whatever its line."""
    path = tmp_path / "trace.jsonl"
    path.write_text(GOOD_ROW + "\n" + bad + "\n")
    with pytest.raises(ConfigError, match=message):
        make_workload("mooncake", overrides={"path": str(path)})


def test_a_whole_length_written_as_a_float_is_read() -> None:
    row = '{"timestamp": 0, "input_length": 4834.0, "output_length": "10", "hash_ids": [1]}'
    path = Path(tempfile.mkdtemp()) / "trace.jsonl"
    path.write_text(row + "\n")
    [session] = make_workload("mooncake", overrides={"path": str(path)}).sessions
    assert len(session.turns[0].tokens) == 32  # one hash id: at most its 32 tokens


def _dialogue_file(tmp_path: Path, texts: list[str]) -> str:
    path = tmp_path / "chat.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"chosen": t, "rejected": t}) + "\n" for t in texts)
    return str(path)


def test_dialogue_turns_from_text(tmp_path: Path) -> None:
    text = "\n\nHuman: Hi there!\n\nAssistant: Hello, friend.\n\nHuman: Bye\n\nAssistant:"
    over = {"path": _dialogue_file(tmp_path, [text]), "sessions": "1"}
    [session] = make_workload("dialogues", overrides=over).sessions
    first, second = session.turns
    assert first.text == "\n\nHuman: Hi there!\n\nAssistant:" and second.text == text
    assert first.output_tokens == 4  # " Hello", ",", " friend", "."
    assert second.output_tokens == 1  # an empty reply still generates a token
    assert is_prefix(first.tokens, second.tokens)


@needs_chat
def test_dialogue_tokens_are_prefixes_and_match_text() -> None:
    w = make_workload("dialogues", overrides={"sessions": "200"})
    tokenizer = WordTokenizer()
    assert len(w.sessions) == 200
    for s in w.sessions:
        for prev, nxt in zip(s.turns, s.turns[1:], strict=False):
            assert is_prefix(prev.tokens, nxt.tokens)
        for t in s.turns:
            assert t.text is not None and t.text.endswith("\n\nAssistant:")
            assert np.array_equal(tokenizer.encode(t.text), t.tokens)


@given(st.text(), st.text(alphabet=".,:!?;-"), st.text())
def test_tokenizer_prefix_property(head: str, punct: str, tail: str) -> None:
    a = head + punct + ":"
    tok = WordTokenizer()
    assert np.array_equal(tok.encode(a + tail), np.concatenate([tok.encode(a), tok.encode(tail)]))


def test_multi_turn_cluster_events() -> None:
    over = {"sessions": "5", "add_replica_at_s": "30", "remove-replica-at-s": "10"}
    events = make_workload("multi-turn", overrides=over).cluster_events
    assert [(e.at_s, e.action, e.replica) for e in events] == [
        (10.0, "remove", "r0"),
        (30.0, "add", "r4"),
    ]
    assert make_workload("multi-turn", overrides={"sessions": "5"}).cluster_events == []


def test_overrides_are_typed() -> None:
    w = make_workload("seed-shared-prompt", overrides={"users": "5", "interval_s": "0.5"})
    assert [s.start_s for s in w.sessions] == [0.0, 0.5, 1.0, 1.5, 2.0]
    over = {"num_groups": "2", "prompts_per_group": "3", "shuffle": "false"}
    groups = [s.tenant for s in make_workload("shared-prefix", overrides=over).sessions]
    assert groups == ["group0"] * 3 + ["group1"] * 3


def test_unknown_workload_lists_names() -> None:
    with pytest.raises(UnknownWorkload, match="multi-turn"):
        make_workload("nope")
    with pytest.raises(UnknownWorkload):
        workload_params("nope")


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("multi-turn", {"bogus": "1"}),  # unknown key
        ("multi-turn", {"sessions": "many"}),  # not an int
        ("multi-turn", {"rate": "-1"}),  # out of range
        ("multi-turn", {"turns_min": "9"}),  # min above max
        ("multi-turn", {"think_mean_s": "nan"}),
        ("shared-prefix", {"shuffle": "maybe"}),
        ("mooncake", {"trace": "other"}),
        ("no-sharing", {"spread": "1.5"}),
        ("seed-conversation", {"answers": "1,2"}),  # turns disagree with retrieved
    ],
)
def test_bad_overrides_raise_config_error(name: str, overrides: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="valid") as info:
        make_workload(name, overrides=overrides)
    assert not isinstance(info.value, UnknownWorkload)
    assert "rate" in str(info.value) or "trace" in str(info.value) or "answers" in str(info.value)


def test_missing_data_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        make_workload("mooncake", overrides={"path": str(tmp_path / "none.jsonl")})


def test_sessions_are_plain_data() -> None:
    w = make_workload("no-sharing", overrides={"requests": "3"})
    assert all(isinstance(s, Session) for s in w.sessions) and w.num_requests == 3


def test_a_missing_data_file_says_how_to_give_one(tmp_path: Path) -> None:
    """A checkout that is not beside ``shared/`` has no default data: the error says how to
    give the file (``--set path=FILE``); a file given and missing is named, no more."""
    hint = r"\(give the workload its file: --set path=FILE\)$"
    with pytest.raises(ConfigError, match=r"not found: .*nope\.jsonl " + hint):
        data_file("", "nope.jsonl")
    with pytest.raises(ConfigError, match=r"not found: .*given\.jsonl$"):
        data_file(str(tmp_path / "given.jsonl"), "nope.jsonl")
