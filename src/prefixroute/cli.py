"""The ``prefixroute`` command: builds the objects and hands them down; no logic of its own.

Each subcommand is one module of :mod:`prefixroute.commands`, named after it (``hash-key`` is
``commands/hash_key.py``). A module exposes ``add_parser(subparsers) -> None``, which sets
``run=`` (a function of the parsed args returning an exit code) as the parser's default.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence

from prefixroute import __version__
from prefixroute._help import with_defaults
from prefixroute.commands import bench, demo, emulate, epp, hash_key, serve, simulate, top
from prefixroute.core import PrefixrouteError

# The subcommands, in the order ``--help`` lists them.
COMMANDS = (simulate, demo, serve, epp, top, hash_key, emulate, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefixroute",
        description="Prefix-cache-aware routing for LLM inference replicas.",
    )
    parser.add_argument("--version", action="version", version=f"prefixroute {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        with_defaults(command_parser)  # every flag's help states its default
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except PrefixrouteError as exc:
        print(f"prefixroute: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prefixroute: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader had what it wanted (as `top` ends)
        _quiet_stdout()
        return 0
    except OSError as exc:  # the output could not be written: a full disk (/dev/full)
        if exc.errno != errno.ENOSPC:
            raise
        print(f"prefixroute: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 2
    return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing more."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
