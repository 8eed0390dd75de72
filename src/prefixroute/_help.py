"""Every flag's ``--help`` line states its default: one rule for all subcommands.

argparse's ``ArgumentDefaultsHelpFormatter`` would add ``(default: None)`` to flags whose value
comes from a config file, and a second default to lines that state theirs already. This mixin
adds ``(default: X)`` only when there is a default to tell and the line does not give it:
neither ``default`` nor ``(X)`` appears in it. ``cli.build_parser`` mixes it into each
subcommand's own formatter class, so a command keeps its own layout (raw epilogs, say).
"""

from __future__ import annotations

import argparse
from typing import Any

_NOTHING_TO_TELL = (None, False, True, argparse.SUPPRESS)


class DefaultsMixin(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        default = action.default
        if (
            not text
            or not action.option_strings
            or any(default is v for v in _NOTHING_TO_TELL)
            or default == []
            or "default" in text
            or f"({default})" in text
        ):
            return text
        return f"{text} (default %(default)s)"


def with_defaults(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s help state every flag's default (see the module docstring)."""
    base: Any = parser.formatter_class
    if not (isinstance(base, type) and issubclass(base, DefaultsMixin)):
        mixed: Any = type(f"Defaults{base.__name__}", (DefaultsMixin, base), {})
        parser.formatter_class = mixed
