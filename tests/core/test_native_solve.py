"""The compiled normal equations (``_native.add_observations``, solve.c) give what the Python
reference (``_solve.add_observations(compiled=False)``) gives, to the bit: the same ``a``,
``c`` and count left out, on random windows (ints and floats, overhead and attention columns
on and off, outliers), so the speed model and the simulator's digests do not depend on which
one ran. So do the compiled solve (``solve_feasible``) and context per token."""

from __future__ import annotations

import copy
import math
import struct
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixroute.core import _native
from prefixroute.core._solve import Obs, add_observations, solve_feasible
from prefixroute.core.speed_fit import _context_per_token

pytestmark = pytest.mark.skipif(
    _native.add_observations is None, reason="the compiled hot path is not built"
)

finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
count = st.one_of(st.integers(min_value=0, max_value=100_000), finite)
observation = st.builds(
    lambda x0, x1, x2, x3, x4, s: Obs((x0, x1, x2, x3, x4), s),
    count,
    count,
    st.one_of(st.just(0.0), count),
    st.one_of(st.just(0.0), st.just(1.0), finite),
    st.one_of(st.just(0.0), finite),
    st.floats(min_value=1e-6, max_value=100.0),
)
window = st.lists(observation, max_size=70).map(lambda obs: deque(obs, maxlen=64))
theta = st.tuples(
    st.floats(min_value=1e-7, max_value=1e-2),
    st.floats(min_value=0.0, max_value=0.1),
    st.floats(min_value=0.0, max_value=0.5),
    st.floats(min_value=0.0, max_value=0.5),
    st.floats(min_value=0.0, max_value=1e-3),
).map(list)


def start() -> tuple[list[list[float]], list[float]]:
    """Normal equations with priors in them, as ``speed_fit.normal_equations`` starts."""
    a = [[0.0] * 5 for _ in range(5)]
    a[0][0], a[1][1], a[2][2], a[3][3], a[4][4] = 1e8, 4444.4, 11.9, 11.9, 1e8
    a[0][4] = a[4][0] = 3e7
    return a, [1e4, 66.7, 0.0, 0.0, 3e3]


slack = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=50_000.0))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(window, min_size=1, max_size=3), theta, st.floats(min_value=1.01, max_value=10),
    st.lists(slack, min_size=3, max_size=3),
)
def test_compiled_equals_the_reference(windows, theta, factor, slacks) -> None:  # type: ignore[no-untyped-def]
    """With and without a floor under some windows' errors (decode phases' slack)."""
    a1, c1 = start()
    a2, c2 = copy.deepcopy(a1), list(c1)
    floors = [s * theta[0] for s in slacks[: len(windows)]]  # seconds, as add_observations
    dropped_c = _native.add_observations(a1, c1, tuple(windows), theta, factor, floors)
    dropped_py = add_observations(a2, c2, windows, theta, factor, slacks, compiled=False)
    assert dropped_c is not None
    a1[1][0] = a1[0][1]  # add_observations' last step, done by its caller on the compiled path
    assert (a1, c1, dropped_c) == (a2, c2, dropped_py)


def test_a_ratio_that_is_not_a_number_falls_back_unchanged() -> None:
    """A prediction that is not a number: the compiled path answers None and changes nothing;
    ``add_observations`` then gives the reference's answer."""
    windows = (
        deque([Obs((100.0, 1.0, 0.0, 1.0, 5.0), 0.01), Obs((200.0, 2.0, 0.0, 1.0, 20.0), 0.02)]),
    )
    nan_theta = [math.nan, 0.01, 0.0, 0.0, 0.0]
    a, c = start()
    before = (copy.deepcopy(a), list(c))
    assert _native.add_observations(a, c, windows, nan_theta, 3.0, [0.0]) is None
    assert (a, c) == before
    a_py, c_py = start()
    expected = add_observations(a_py, c_py, windows, nan_theta, 3.0, compiled=False)
    assert add_observations(a, c, windows, nan_theta, 3.0) == expected
    assert str((a, c)) == str((a_py, c_py))  # nan != nan: compared as text


def test_bad_arguments_are_errors_not_crashes() -> None:
    a, c = start()
    with pytest.raises(TypeError):
        _native.add_observations([[0.0] * 5], c, (), [0.0] * 5, 3.0, [])
    with pytest.raises(ValueError):
        _native.add_observations(a, c, (), [0.0] * 4, 3.0, [])
    with pytest.raises(ValueError):  # a floor for each window
        _native.add_observations(a, c, ([],), [1e-4] + [0.0] * 4, 3.0, [])
    with pytest.raises(ValueError):  # an observation of the four-unknown model
        four = Obs((1.0, 0.0, 0.0, 1.0), 0.1)  # type: ignore[arg-type]
        _native.add_observations(a, c, ([four],), [1e-4] + [0.0] * 4, 3.0, [0.0])
    with pytest.raises(AttributeError):
        _native.add_observations(a, c, ([object()],), [1e-4, 0.0, 0.0, 0.0, 0.0], 3.0, [0.0])


def _bits(values: list[float]) -> list[str]:
    """Floats as their exact bits (NaN and -0.0 compare as what they are)."""
    return [struct.pack("<d", v).hex() for v in values]


# Matrices as a refit makes them (priors, then observations) and arbitrary ones: singular,
# signed, zero rows, so every branch of the solve (Cramer, elimination, a pivot below 1e-300,
# infeasible unknowns fixed and solved again) is taken.
entry = st.one_of(
    st.just(0.0),
    st.sampled_from([1.0, -1.0, 2.0, 0.5, math.inf]),  # ties between pivots; inf x 0 is NaN
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, width=64),
)
any_matrix = st.lists(st.lists(entry, min_size=5, max_size=5), min_size=5, max_size=5)
any_theta = st.lists(st.one_of(st.just(0.0), entry), min_size=5, max_size=5)
free_set = st.sets(st.integers(min_value=0, max_value=4)).map(sorted)


@settings(max_examples=400, deadline=None)
@given(st.lists(window, min_size=1, max_size=3), theta, free_set)
def test_compiled_solve_equals_the_reference_on_refit_equations(windows, theta, free) -> None:  # type: ignore[no-untyped-def]
    a, c = start()
    add_observations(a, c, windows, theta, 3.0, compiled=False)
    got = solve_feasible(copy.deepcopy(a), list(c), list(theta), list(free))
    want = solve_feasible(a, c, theta, free, compiled=False)
    assert _bits(got) == _bits(want)


@settings(max_examples=400, deadline=None)
@given(any_matrix, any_theta, any_theta, free_set)
def test_compiled_solve_equals_the_reference_on_any_system(a, c, current, free) -> None:  # type: ignore[no-untyped-def]
    got = solve_feasible(copy.deepcopy(a), list(c), list(current), list(free))
    want = solve_feasible(a, c, current, free, compiled=False)
    assert _bits(got) == _bits(want)


@settings(max_examples=200, deadline=None)
@given(window)
def test_compiled_context_per_token_equals_the_reference(obs) -> None:  # type: ignore[no-untyped-def]
    assert _bits([_context_per_token(obs)]) == _bits([_context_per_token(obs, compiled=False)])


def test_the_solve_is_compiled_and_keeps_a_rate_positive() -> None:
    """Both paths as the docstring says: a fit whose rate comes out negative keeps the current
    rate and solves the rest again; a singular system returns the current estimates."""
    assert _native.solve_feasible is not None
    a = [[1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]] + [[0.0] * 5 for _ in range(3)]
    current = [2e-4, 0.01, 0.0, 0.0, 0.0]
    for compiled in (True, False):
        theta = solve_feasible(a, [-1.0, 0.5, 0.0, 0.0, 0.0], current, [0, 1], compiled=compiled)
        assert theta == [2e-4, 0.5, 0.0, 0.0, 0.0]
        singular = [[0.0] * 5 for _ in range(5)]
        theta = solve_feasible(singular, [1.0] * 5, current, [0, 1, 4], compiled=compiled)
        assert theta == current
