"""The ``prefixroute`` command: builds the objects and hands them down; no logic of its own.

Each subcommand lives in its package's ``command`` module, which exposes
``add_parser(subparsers) -> None`` and sets ``run=`` (a function of the parsed args returning an
exit code) as the parser default. Modules are imported only when listed here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from prefixroute import __version__
from prefixroute._help import with_defaults
from prefixroute.core import PrefixrouteError

# Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "prefixroute.sim.command",
    "prefixroute.demo",
    "prefixroute.serve",
    "prefixroute.epp.command",
    "prefixroute.top",
    "prefixroute.keys",
    "prefixroute.emulate.command",
    "prefixroute.bench.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefixroute",
        description="Prefix-cache-aware routing for LLM inference replicas.",
    )
    parser.add_argument("--version", action="version", version=f"prefixroute {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    for command in sub.choices.values():
        with_defaults(command)  # every flag's help states its default
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
    return code


if __name__ == "__main__":
    sys.exit(main())
