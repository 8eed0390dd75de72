"""dialogues: real multi-turn chats from Anthropic's hh-rlhf (harmless-base test split).

Each dialogue's ``chosen`` text alternates "\\n\\nHuman:" and "\\n\\nAssistant:" turns. Replayed
turn by turn, turn k's prompt is the text up to and including Human turn k plus "\\n\\nAssistant:",
and its output is the length of the Assistant reply that follows, so prompts grow with real text
and real reply lengths. Tokens come from a word-level tokenizer whose tokens of a prefix are a
prefix of the tokens (see ``_text.py``), so turn k's tokens are a prefix of turn k+1's.
Dialogues start as a Poisson process; users think (exponential) between turns.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prefixroute.core import ConfigError
from prefixroute.sim.workload import Session, Turn, Workload
from prefixroute.sim.workloads._build import poisson_starts, prefix_turns
from prefixroute.sim.workloads._config import check_non_negative, check_positive, param
from prefixroute.sim.workloads._data import data_file
from prefixroute.sim.workloads._params import shared_param
from prefixroute.sim.workloads._text import WordTokenizer

_MARKER = re.compile(r"\n\n(Human|Assistant):")


@dataclass(frozen=True, slots=True)
class DialoguesConfig:
    sessions: int = param(1500, "dialogues, drawn without replacement (0: all)")
    rate: float = param(135.0, "dialogue starts per second (Poisson)")
    think_mean_s: float = shared_param("think_pause_mean", 3.0)
    path: str = param("", "a .jsonl.gz file to read instead (hh-rlhf format)")

    def __post_init__(self) -> None:
        check_positive(self, "rate")
        check_non_negative(self, "sessions", "think_mean_s")


def _read(path: Path) -> list[str]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [str(json.loads(line)["chosen"]) for line in f if line.strip()]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read dialogues from {path}: {exc}") from exc


def _turn_bounds(text: str) -> list[tuple[int, int]]:
    """(end of the prompt, end of the reply) in characters, one pair per Assistant turn."""
    marks = list(_MARKER.finditer(text))
    bounds = []
    for k, m in enumerate(marks):
        if m.group(1) == "Assistant":
            reply_end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
            bounds.append((m.end(), reply_end))
    return bounds


def _turns(text: str, tokenizer: WordTokenizer, thinks: list[float]) -> list[Turn]:
    tokens, ends = tokenizer.encode_with_ends(text)
    bounds = _turn_bounds(text)
    cuts, outputs = [], []
    for prompt_end, reply_end in bounds:
        cut = int(np.searchsorted(ends, prompt_end, side="right"))
        cuts.append(cut)
        outputs.append(int(np.searchsorted(ends, reply_end, side="right")) - cut)
    texts = [text[:p] for p, _ in bounds]
    return prefix_turns(tokens, cuts, outputs, thinks[: len(cuts)], texts)


def build(config: DialoguesConfig, seed: int) -> Workload:
    path = data_file(config.path, "chat/hh-rlhf_harmless-base_test.jsonl.gz")
    dialogues = _read(path)
    n = config.sessions or len(dialogues)
    if n > len(dialogues):
        raise ConfigError(f"sessions={n} but {path.name} holds {len(dialogues)} dialogues")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(dialogues), size=n, replace=False)
    starts = poisson_starts(rng, n, config.rate)
    tokenizer = WordTokenizer()
    sessions = []
    for d, start in zip(picks, starts, strict=True):
        text = dialogues[d]
        size = text.count("\n\nAssistant:")
        thinks = [float(t) for t in rng.exponential(config.think_mean_s, size)]
        turns = _turns(text, tokenizer, thinks)
        if turns:
            sessions.append(Session(session_id=f"hh{d}", start_s=float(start), turns=turns))
    return Workload(
        name="dialogues",
        sessions=sessions,
        block_size=16,
        description=f"{len(sessions)} hh-rlhf dialogues replayed turn by turn at {config.rate:g}/s",
    )
