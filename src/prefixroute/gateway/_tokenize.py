"""Token-exact routing keys: prompts tokenized as the engine tokenizes them, off the event loop.

With ``--tokenizer DIR`` (a local Hugging Face tokenizer directory, never a download) the
gateway keys a request by the token ids the engine will see, so its block hashes meet the
engine's blocks exactly (and the KV events' token ids, in precise mode). We follow vLLM's
OpenAI server:

* ``/v1/completions``: a string prompt is encoded with the tokenizer's special tokens (the BOS
  a Llama post-processor adds) unless the body says ``"add_special_tokens": false``.
* ``/v1/chat/completions``: the messages are rendered by the ``chat_template`` of
  ``tokenizer_config.json`` with ``add_generation_prompt=True`` (as transformers renders it: a
  sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``), then encoded without
  special tokens (the template writes them). Text content parts are joined with newlines.

Only the ``tokenizers`` library (Rust) and ``jinja2`` are used, not ``transformers``, which would
pull in a deep-learning stack to read two JSON files.

Cost (benchmarks/precise_bench.py, the tiny model's byte-level BPE): about 1.5 µs a token, so
0.5 ms for a 400-token chat prompt, 2 ms at 1,700 tokens, 10 ms at 8,000: 40-55x the cost of
hashing the same tokens into blocks. That blocks an event loop, so it runs in worker threads.

Why threads and not processes: ``Tokenizer.encode_batch`` releases the GIL while its Rust code
runs (plain ``encode`` does not: the event loop ran 20x slower beside it), so a worker thread
takes the work off the loop at the price of a ``str`` in and a ``list[int]`` out. A process
pool would add pickling both ways, a tokenizer per process and a second copy of each prompt,
for no more cores than threads get. Measured on 2 cores while 40 8k-token prompts were
tokenized: the loop's longest stall was 28-76 ms inline, ~5 ms with one worker thread (two
threads fought the loop for the second core: ~15 ms). Rendering the chat template holds the
GIL but costs tens of microseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer

from prefixroute.core import ConfigError, RouteKey

log = logging.getLogger(__name__)


class PromptTokenizer(Protocol):
    """What the gateway needs from a tokenizer (tests pass fakes)."""

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A completion prompt's token ids."""
        ...

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_special_tokens: bool = False
    ) -> list[int]:
        """A chat request's token ids: the rendered template, then encoded."""
        ...


class HFTokenizer:
    """A Hugging Face tokenizer directory: ``tokenizer.json`` + ``tokenizer_config.json``."""

    def __init__(self, path: str | Path) -> None:
        directory = Path(path)
        try:
            self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises plain Exception for unreadable files
            raise ConfigError(f"cannot load {directory / 'tokenizer.json'}: {exc}") from exc
        config = _read_config(directory / "tokenizer_config.json")
        self.special_tokens = {
            name: _token_text(config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self.chat_template: jinja2.Template | None = None
        if isinstance(template, str):
            try:
                self.chat_template = _environment().from_string(template)
            except jinja2.TemplateError as exc:
                raise ConfigError(f"the chat template of {directory} is invalid: {exc}") from exc

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._encode(text, add_special_tokens)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_special_tokens: bool = False
    ) -> list[int]:
        return self._encode(self.render_chat(messages), add_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        if self.chat_template is None:
            raise ConfigError("the tokenizer has no chat_template: chat requests cannot be keyed")
        plain = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        try:
            return self.chat_template.render(
                messages=plain, add_generation_prompt=True, tools=None, **self.special_tokens
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template failed: {exc}") from exc

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch releases the GIL (see the module docstring); the _fast variant skips
        # the character offsets we never use (tokenizers >= 0.20).
        batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        ids: list[int] = batch([text], add_special_tokens=add_special_tokens)[0].ids
        return ids


class TokenizerPool:
    """Runs a tokenizer in worker threads; owned by the gateway app (started and shut down).

    ``observe`` gets each tokenization's cost in seconds, measured inside the worker (the work
    itself, not the wait for a free worker); ``failed`` is called when a prompt cannot be
    tokenized, and the request keeps its text key (the replica will judge the request).
    """

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        workers: int = 1,
        observe: Callable[[float], None] | None = None,
        failed: Callable[[], None] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._observe = observe
        self._failed = failed
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")

    async def key(self, key: RouteKey) -> RouteKey:
        """``key`` with the engine's token ids (unchanged when it has them or has no text)."""
        if key.tokens is not None or not (key.text or key.messages):
            return key
        loop = asyncio.get_running_loop()
        try:
            tokens = await loop.run_in_executor(self._pool, self._tokenize, key)
        except (ValueError, TypeError, ConfigError) as exc:
            log.debug("not tokenized, routed on text: %s", exc)
            if self._failed is not None:
                self._failed()
            return key
        return dataclasses.replace(key, text=None, tokens=tokens)

    def _tokenize(self, key: RouteKey) -> list[int]:
        started = time.perf_counter()
        if key.messages is not None:
            special = False if key.add_special_tokens is None else key.add_special_tokens
            tokens = self.tokenizer.encode_chat(key.messages, special)
        else:
            special = True if key.add_special_tokens is None else key.add_special_tokens
            tokens = self.tokenizer.encode_prompt(key.text or "", special)
        if self._observe is not None:
            self._observe(time.perf_counter() - started)
        return tokens

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return raw


def _token_text(value: object) -> str:
    """A special token as written in tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return ""


def _content_text(content: object) -> object:
    """Text parts joined by newlines, as vLLM passes content to a string-content template."""
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return "" if content is None else content


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _environment() -> jinja2.Environment:
    """The environment transformers renders chat templates in (sandboxed, trimmed blocks)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )

    def tojson(value: object, indent: int | None = None) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=False)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    return env
