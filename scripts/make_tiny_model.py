"""Build a tiny Llama for real-vLLM tests, locally, with no download.

    .cache/vllm-venv/bin/python scripts/make_tiny_model.py [OUT_DIR]   # default .cache/tiny-llama

What it writes (a Hugging Face model directory vLLM loads with ``--model OUT_DIR``):

* ``tokenizer.json``: a byte-level BPE (GPT-2 style pre-tokenizer, so any text encodes) trained
  with ``tokenizers`` on a deterministic corpus, with special tokens ``<s>``, ``</s>`` and the chat
  role markers, and a post-processor that puts ``<s>`` before a plain prompt, as Llama's does.
* ``tokenizer_config.json``: the special tokens and a ``chat_template`` that starts with
  ``{{ bos_token }}`` (so chat prompts, which vLLM tokenizes without special tokens, get one too).
* ``config.json`` + ``model.safetensors``: a 2-layer Llama with random weights (seeded), head
  dim 64 (vLLM's CPU attention wants a head size it has kernels for), 4096 positions, float32.

The weights are noise: the model generates gibberish, which is all a routing test needs; what
matters is that vLLM runs it with its real scheduler, prefix cache and KV-event publisher.
Run by ``make test-vllm`` (through scripts/setup_vllm.sh's venv); idempotent: an existing
complete directory is kept unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 2048  # tokens; small, but BPE merges still make a prompt ~4x shorter than its bytes
HIDDEN = 256  # model width
LAYERS = 2
HEADS = 4  # head dim = 256 / 4 = 64
MAX_POSITIONS = 4096  # tokens
SEED = 0
SPECIALS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

_TEXT = (
    "the of and to in is that it for was on are as with be at by this have from or one had "
    "not but what all were when we there can an your which their said if do will each about "
    "how up out them then she many some so these would other into has more her two like him "
    "see time could no make than first been its who now people my made over did down only way "
    "find use may water long little very after words called just where most know cache prefix "
    "token tokens block blocks replica replicas router routing request requests prompt model "
    "system user assistant question answer context retrieved document conversation turn "
    "latency throughput memory engine server gateway policy load balance hit miss event "
    "events stored removed cleared sequence number batch queue prefill decode first second"
)
WORDS = _TEXT.split()


def corpus(lines: int = 4000) -> list[str]:
    """Deterministic English-like text, plus the shapes the tests send (w123, digits)."""
    rng = random.Random(SEED)
    out = []
    for i in range(lines):
        n = rng.randint(5, 30)
        words = [rng.choice(WORDS) for _ in range(n)]
        words.insert(rng.randint(0, n), f"w{rng.randint(0, 3000)}")
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ",", ";", ":"])
        out.append(sentence if i % 7 else sentence + f" {i} ({rng.random():.3f})")
    return out


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "</s>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))


def build_model(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=".cache/tiny-llama", help="output directory")
    parser.add_argument("--force", action="store_true", help="rebuild an existing model")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.force and all((out / f).is_file() for f in FILES):
        print(f"make_tiny_model: {out} already built (--force to rebuild)")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_model(out)
    missing = [f for f in FILES if not (out / f).is_file()]
    if missing:
        print(f"make_tiny_model: FAILED: {', '.join(missing)} not written", file=sys.stderr)
        return 1
    print(f"make_tiny_model: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
