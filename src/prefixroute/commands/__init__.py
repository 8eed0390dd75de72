"""The ``prefixroute`` subcommands: one module per command, named after it.

``prefixroute simulate`` is :mod:`.simulate`, ``prefixroute hash-key`` is :mod:`.hash_key`, and
so on; ``prefixroute.cli`` imports each by name. A command module exposes
``add_parser(subparsers) -> None`` and ``run(args) -> int`` (set as the parser's ``run=``
default). It turns flags into the config objects of the packages it wires together and calls
them: the packages (``sim``, ``gateway``, ``emulate``, ``bench``, ``epp``) hold no argparse code,
and they never import this package. Helpers two commands share sit in ``_args`` (flag parsing)
and ``_settings`` (the gateway's flags, generated from ``GatewayConfig``'s fields).
"""
