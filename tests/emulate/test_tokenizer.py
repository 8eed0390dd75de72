from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prefixroute.emulate import count_tokens, render_chat, tokenize
from prefixroute.emulate._tokenizer import filler, message_text


def test_words_are_tokens() -> None:
    assert len(tokenize("w1 w2 w3")) == 3
    assert count_tokens("w1 w2 w3") == 3
    assert len(tokenize("Hello, world!")) == 4  # Hello / , / world / !
    assert tokenize("w1 w2") == tokenize("w1 w2")  # deterministic
    assert tokenize("w1") != tokenize(" w1")  # the leading space is part of the piece


words = st.lists(st.sampled_from(["w1", "w22", "a", ",", ".", "xyz"]), min_size=1, max_size=30)


@given(words, words)
def test_a_text_prefix_gives_a_token_prefix(a: list[str], b: list[str]) -> None:
    short = " ".join(a)
    long = short + " " + " ".join(b)
    assert tokenize(long)[: len(tokenize(short))] == tokenize(short)


def test_chat_turns_extend_each_other() -> None:
    turn1 = [("system", "be brief"), ("user", "hi there")]
    prompt1 = render_chat(turn1)
    reply = filler(0, 5)
    prompt2 = render_chat([*turn1, ("assistant", reply), ("user", "and then?")])
    assert prompt2.startswith(prompt1)
    t1, t2 = tokenize(prompt1), tokenize(prompt2)
    assert t2[: len(t1)] == t1


def test_filler_is_one_token_per_word() -> None:
    assert count_tokens(filler(0, 25)) == 25
    assert filler(0, 3) + filler(3, 5) == filler(0, 5)


def test_message_text() -> None:
    assert message_text("x") == "x"
    assert message_text(None) == ""
    assert message_text([{"type": "text", "text": "a"}, {"type": "image_url"}]) == "a"
