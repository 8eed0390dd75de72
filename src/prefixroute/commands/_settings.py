"""The gateway's settings as flags, ``--help`` text and docs/configuration.md's table, all made from
``GatewayConfig``'s field declarations (:func:`prefixroute.gateway.config_fields`).

A field with a flag becomes that flag, its value type and repetition read from the field's
type; a secret field (one with an environment variable) also gets ``--<name>-file``. A flag
left out stays None, so the config file's value (or the field's default) holds.
"""

from __future__ import annotations

import argparse
import textwrap
import typing
from collections.abc import Collection, Mapping
from types import NoneType, UnionType
from typing import Any

from prefixroute.gateway import ConfigField, config_fields

ON_THE_COMMAND_LINE = "the value itself: avoid, every local user can read it in ps and /proc"


def add_setting_flags(parser: argparse.ArgumentParser, only: Collection[str] = ()) -> None:
    """A flag for each field that has one (of ``only``'s fields, when given), in field order."""
    for f in config_fields():
        if only and f.name not in only:
            continue
        if f.secret_file_key is not None:
            _add_secret_flags(parser, f)
        elif f.setting.flag is not None:
            parser.add_argument(f.setting.flag, dest=f.name, help=flag_help(f), **_value_kind(f))


def _add_secret_flags(parser: argparse.ArgumentParser, f: ConfigField) -> None:
    """``--<name>-file PATH`` (the way to give a secret), and the field's own flag if it has
    one, the two mutually exclusive."""
    group = parser.add_mutually_exclusive_group()
    key = f.secret_file_key or ""
    group.add_argument(
        "--" + key.replace("_", "-"),
        dest=key,
        metavar="PATH",
        help=_escape(f"file holding {f.setting.help} (or ${f.setting.env})"),
    )
    if f.setting.flag is not None:
        group.add_argument(f.setting.flag, dest=f.name, help=ON_THE_COMMAND_LINE)


def _value_kind(f: ConfigField) -> dict[str, Any]:
    """argparse's ``type`` / ``action`` / ``metavar`` / ``choices`` for the field's type."""
    out: dict[str, Any] = {}
    origin = typing.get_origin(f.kind)
    if f.kind is bool:
        out.update(action="store_true", default=None)  # None: the file's value holds
    elif origin is tuple or origin is Mapping:
        out["action"] = "append"  # once per item; the command turns KEY=VALUE into a mapping
    else:
        out["type"] = scalar_type(f.kind)
    if f.setting.metavar is not None:
        out["metavar"] = f.setting.metavar
    if f.setting.choices is not None:
        out["choices"] = list(f.setting.choices())
    return out


def scalar_type(kind: Any) -> type[Any]:
    """int, float or str, from ``int``, ``float | None``, ``str | None`` and the like."""
    args = [a for a in typing.get_args(kind) if a is not NoneType]
    base = args[0] if isinstance(kind, UnionType) and len(args) == 1 else kind
    if base not in (int, float, str):
        raise TypeError(f"a setting flag needs an int, float or str field, not {kind!r}")
    return typing.cast(type[Any], base)


def setting_values(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting flag's value by field name (``<name>_file`` for a secret's file), None
    where the flag was not given."""
    out: dict[str, Any] = {}
    for f in config_fields():
        if f.secret_file_key is not None:
            out[f.secret_file_key] = getattr(args, f.secret_file_key)
        if f.setting.flag is not None:
            out[f.name] = getattr(args, f.name)
    return out


def flag_help(f: ConfigField) -> str:
    """The field's help, with its default when it has a value to state (not unset, off or
    empty: those the help line would only repeat)."""
    value = f.default
    if value is None or isinstance(value, bool) or value in ((), {}):
        return _escape(f.setting.help)
    return _escape(f"{f.setting.help} (default {f.setting.shown_default or value})")


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help strings


def file_only_help(width: int = 92) -> str:
    """The settings that have no flag, for the end of ``serve --help``."""
    lines = ["Settings only the config file sets (TOML key = default: meaning):"]
    for f in config_fields():
        if f.setting.flag is not None or f.secret_file_key is not None:
            continue
        text = f"{f.name} = {toml_default(f)}: {f.setting.help}"
        lines += textwrap.wrap(
            text, width, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False
        )
    lines += textwrap.wrap(
        "Each flag above sets a TOML key too: the flag in snake_case, with _s for seconds "
        "(--read-timeout: read_timeout_s), replicas for --replica, replica_speeds for "
        "--replica-speed and policy_params for --policy-param, except --config, --emulate "
        "and --verbose, which are the command's own; docs/configuration.md lists every key.",
        width,
        break_on_hyphens=False,
    )
    return "\n".join(lines) + "\n"


def toml_default(f: ConfigField) -> str:
    """The default as a TOML reader would write it (or in words, where TOML has no value)."""
    if f.setting.shown_default is not None:
        return f.setting.shown_default
    if f.default is None:
        return "unset"
    if isinstance(f.default, bool):
        return "true" if f.default else "false"
    if isinstance(f.default, str):
        return f'"{f.default}"'
    return str(f.default)


TABLE_HEADER = "| TOML key | `serve` flag | default | meaning |\n|---|---|---|---|\n"


def markdown_table() -> str:
    """The settings table of docs/configuration.md (``scripts/config_table.py`` writes it)."""
    rows = []
    for f in config_fields():
        key, meaning = f"`{f.name}`", f.setting.help
        flags = [f.setting.flag] if f.setting.flag else []
        if f.secret_file_key is not None:
            key += f" or `{f.secret_file_key}`"
            flags.insert(0, "--" + f.secret_file_key.replace("_", "-"))
            meaning += f"; or `${f.setting.env}`"
        flag = ", ".join(f"`{x}`" for x in flags) or "-"
        in_words = f.setting.shown_default is not None or f.default is None
        default = toml_default(f) if in_words else f"`{toml_default(f)}`"
        meaning = meaning.replace("*", "\\*").replace("<", "&lt;")  # not markdown
        rows.append(f"| {key} | {flag} | {default} | {meaning} |\n")
    return TABLE_HEADER + "".join(rows)


TABLE_START = (
    "<!-- gateway settings: written by scripts/config_table.py from GatewayConfig's fields; "
    "edit those, not this table -->\n"
)
TABLE_END = "<!-- end of gateway settings -->\n"


def with_table(readme: str) -> str:
    """``readme`` with the text between the table's two markers replaced by
    :func:`markdown_table`; ValueError when the markers are missing."""
    start = readme.find(TABLE_START)
    end = readme.find(TABLE_END, start)
    if start < 0 or end < 0:
        raise ValueError("the document has no gateway-settings table markers")
    body = start + len(TABLE_START)
    return readme[:body] + "\n" + markdown_table() + "\n" + readme[end:]
