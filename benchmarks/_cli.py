"""What the benchmarks' command lines share (imported by path: benchmarks are scripts)."""

from __future__ import annotations

import argparse


def seed_list(text: str) -> list[int]:
    """``--seeds 0,1,2`` as integers; anything else is argparse's one-line usage error."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated integers, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("want at least one seed")
    return seeds


def add_seeds(parser: argparse.ArgumentParser, default: str) -> None:
    """The ``--seeds`` option: the workload seeds every policy runs on."""
    parser.add_argument(
        "--seeds", type=seed_list, default=seed_list(default),
        help=f"comma list of seeds (default {default})",
    )  # fmt: skip
