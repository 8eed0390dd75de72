"""The valid range of a policy's numeric parameters, declared beside each field.

A parameter outside its range used to run without a word: ``cache_threshold=-5`` made
``cache_aware`` follow any match however short, a negative weight turned a scorer around, and
TOML's ``nan`` compared false everywhere. :func:`make_policy` checks every range it is given
(CLI, gateway config, simulator), so a bad value is one ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

RANGE = "range"  # the metadata key: (lowest, highest), both allowed


def ranged(default: float, lowest: float, highest: float = math.inf) -> Any:
    """A config field with ``default`` whose values must lie in ``[lowest, highest]``
    (``highest`` infinite: infinity itself is allowed, as "never")."""
    return dataclasses.field(default=default, metadata={RANGE: (lowest, highest)})


def out_of_range(field: dataclasses.Field[Any], value: float) -> str | None:
    """Why ``value`` is outside ``field``'s range (None: inside it, or no range declared)."""
    bounds = field.metadata.get(RANGE)
    if bounds is None:
        return None
    lowest, highest = bounds
    if lowest <= value <= highest:  # NaN is never inside
        return None
    if highest == math.inf:
        return f"must be at least {lowest:g}, got {value:g}"
    return f"must be between {lowest:g} and {highest:g}, got {value:g}"
