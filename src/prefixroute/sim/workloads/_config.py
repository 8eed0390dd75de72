"""Workload configs: fields with help text, string overrides converted to field types, checks.

Each workload keeps its parameters in one frozen dataclass whose fields carry a one-line help in
``metadata`` (units included), so the CLI can list them without parsing source comments.
Overrides arrive as strings (``--param rate=12``) and are converted to the field's declared type
here, in one place, so every workload rejects a bad key or value with the same message.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from prefixroute.core import ConfigError

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def param(default: T, doc: str) -> T:
    """A config field with a default and its help text (typed as the default for mypy)."""
    return dataclasses.field(default=default, metadata={"help": doc})


def field_specs(config_cls: type[Any]) -> dict[str, tuple[type[Any], object, str]]:
    """name -> (type, default, help) for every field of a config dataclass, in field order."""
    hints = typing.get_type_hints(config_cls)
    return {
        f.name: (hints[f.name], f.default, str(f.metadata.get("help", "")))
        for f in dataclasses.fields(config_cls)
    }


def convert(kind: type[Any], text: str) -> object:
    """Parse ``text`` as ``kind`` (int, float, str or bool); ValueError when it is not one."""
    if kind is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(text)
    if kind is int:
        return int(text)
    if kind is float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(text)
        return value
    if kind is str:
        return text
    raise TypeError(f"config fields must be int, float, str or bool, not {kind!r}")


def build_config(name: str, config_cls: type[T], overrides: Mapping[str, str]) -> T:
    """``config_cls`` with its defaults, overridden by the string ``overrides``.

    Raises ConfigError (listing the valid keys) for an unknown key, an unparsable value, or a value
    the config's own checks reject. Dashes in keys are accepted for underscores (CLI spelling).
    """
    specs = field_specs(config_cls)
    valid = ", ".join(specs) or "none"
    values: dict[str, object] = {}
    for raw_key, text in overrides.items():
        key = raw_key.strip().replace("-", "_")
        if key not in specs:
            raise ConfigError(f"workload {name!r} has no parameter {raw_key!r}; valid: {valid}")
        kind = specs[key][0]
        try:
            values[key] = convert(kind, text)
        except ValueError:
            raise ConfigError(
                f"workload {name!r}: {raw_key}={text!r} is not a valid {kind.__name__}; "
                f"valid keys: {valid}"
            ) from None
    try:
        return config_cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"workload {name!r}: {exc}; valid keys: {valid}") from exc


def check_positive(config: object, *names: str) -> None:
    """Raise ConfigError unless each named field is > 0."""
    for n in names:
        value = getattr(config, n)
        if not value > 0:
            raise ConfigError(f"{n} must be > 0, got {value}")


def check_non_negative(config: object, *names: str) -> None:
    """Raise ConfigError unless each named field is >= 0."""
    for n in names:
        value = getattr(config, n)
        if value < 0:
            raise ConfigError(f"{n} must be >= 0, got {value}")


def check_range(config: object, low: str, high: str) -> None:
    """Raise ConfigError unless field ``low`` <= field ``high`` (a min/max pair)."""
    lo, hi = getattr(config, low), getattr(config, high)
    if lo > hi:
        raise ConfigError(f"{low} ({lo}) must not exceed {high} ({hi})")
