"""The article's two examples as chat requests for the tiny model, sized in its tokens.

* ``conversation()``: one 5-turn conversation (the article's example 1): a 200-token system
  prompt; each turn adds a 25-token question and 175-225 tokens of retrieved context, and each
  answer (100-150 tokens, fixed text, as the article counts it) joins the history of the next
  turn. Prompts grow to about 400, 700, 1000, 1400 and 1700 tokens.
* ``shared_prompt()``: users behind one system prompt (the article's example 2), each with a
  50-token question of their own.
* ``ttft_prompt()``: one long prompt for the cold/warm TTFT probe.

Text is drawn from a fixed word list with a seeded RNG and sized with the model's tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from prefixroute.gateway import HFTokenizer

_TEXT = (
    "the of and to in is that it for was on are as with be at by this have from or one had "
    "cache prefix token block replica router routing request prompt model system user answer "
    "context retrieved document conversation latency throughput memory engine server gateway"
)
WORDS = _TEXT.split()


@dataclass
class Sizer:
    tokenizer: HFTokenizer
    rng: random.Random

    def text(self, tokens: int, tag: str) -> str:
        """About ``tokens`` tokens of text (never fewer), starting with ``tag``."""
        words = [tag]
        while len(self.tokenizer.encode_prompt(" ".join(words), add_special_tokens=False)) < tokens:
            words.extend(self.rng.choice(WORDS) for _ in range(max(1, (tokens - len(words)) // 3)))
        return " ".join(words)


def conversation(tokenizer: HFTokenizer, seed: int) -> list[list[dict[str, str]]]:
    """The message list of each turn (each extends the previous turn's)."""
    size = Sizer(tokenizer, random.Random(seed))
    retrieved = (175, 175, 175, 225, 175)
    answers = (100, 100, 150, 100, 100)
    messages = [{"role": "system", "content": size.text(200, f"system{seed}")}]
    turns = []
    for k, (context, answer) in enumerate(zip(retrieved, answers, strict=True)):
        question = size.text(25, f"question{k}")
        messages.append({"role": "user", "content": question + "\n" + size.text(context, "doc")})
        turns.append(list(messages))
        messages.append({"role": "assistant", "content": size.text(answer, f"answer{k}")})
    return turns


def shared_prompt(tokenizer: HFTokenizer, seed: int, users: int) -> list[list[dict[str, str]]]:
    size = Sizer(tokenizer, random.Random(seed))
    system = {"role": "system", "content": size.text(600, f"shared{seed}")}
    return [
        [system, {"role": "user", "content": size.text(50, f"user{u}")}] for u in range(users)
    ]


def ttft_prompt(tokenizer: HFTokenizer, seed: int, tokens: int) -> str:
    return Sizer(tokenizer, random.Random(seed)).text(tokens, f"probe{seed}")
