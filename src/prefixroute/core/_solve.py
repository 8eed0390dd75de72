"""Small linear least squares for the speed model (:mod:`prefixroute.core.speed`): its
observations, their normal equations (two to five unknowns), solved with the feasibility rules
of a speed (a rate positive, a time not negative). The core takes no numerical library; adding
the observations (a pass over every window at every refit) and the solve are compiled when the
extension is built (``solve.c``), to the bit: the Python here is their reference. The solve was
Python until 2026-12-05, when it took a sixth of a refit at 1,000 replicas (cProfile).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prefixroute.core import _native


@dataclass(slots=True)
class Obs:
    """One observation: ``seconds = x . (1/rate, decode step, engine overhead, overhead,
    attention)``."""

    # tokens, decode steps, engine requests, first tokens, context work (core/context_cost.py)
    x: tuple[float, float, float, float, float]
    seconds: float  # the time measured, seconds

    @property
    def whole(self) -> bool:
        """An answer that came whole (its decode phase in it: :class:`QueuedObs`)."""
        return False


@dataclass(slots=True)
class QueuedObs(Obs):
    """A first token's observation that knows the queue it waited behind: its work (``x``) is
    the part of that queue left at dispatch plus its own tokens, at the estimates ``basis``."""

    queued: float = 0.0  # prefill tokens queued ahead at dispatch, no progress credited
    elapsed_s: float = 0.0  # how long the replica had been on that queue, seconds
    decoding: bool = False  # the replica was decoding at dispatch
    own: float = 0.0  # the request's own uncached tokens
    queued_context: float = 0.0  # the queue's context work at dispatch (core/context_cost.py)
    own_context: float = 0.0  # the request's own context work
    basis: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (rate, step, attention) of ``x``
    seq: int = 0  # its request's place among the replica's dispatches (core/queue_fixes.py)
    # An answer that came whole: the (tokens prefilled for others, decode steps, their context
    # work) of its decode phase, added to its first token's work (core/speed.py).
    after: tuple[float, float, float] | None = None

    @property
    def whole(self) -> bool:
        return self.after is not None


@dataclass(slots=True)
class PhaseObs(Obs):
    """A decode phase's observation that knows whose prefill shared its steps: the requests
    whose first tokens were the ``mark+1``-th to the ``through``-th on its replica, counted at
    their predicted uncached tokens until their usage says otherwise (core/queue_fixes.py)."""

    mark: int = 0
    through: int = 0
    # The prefill under way when it ended, whose first token came after it (as QueuedObs's
    # queue): its progress by then, at the estimates ``basis``, is ``credit`` (tokens, context
    # work), in ``x`` beside what was counted (core/queue_credit.py).
    queued: float = 0.0  # prefill tokens queued on its replica at its end
    elapsed_s: float = 0.0  # how long the replica had been on that queue, seconds
    queued_context: float = 0.0  # that queue's context work
    basis: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (rate, step, attention) of credit
    credit: tuple[float, float] = (0.0, 0.0)
    queue_seq: int = 0  # its replica's dispatches at its end: that queue's were up to this one

    def correct(self, no: int, tokens: float, context: float, seq: int = 0) -> bool:
        """The ``no``-th first token's request, dispatched ``seq``-th, computed ``tokens``
        more (and ``context`` more context work) than counted: so did this phase, where it was
        one of them; so was the queue at its end, where it was in it (dispatched by then, its
        first token after): then True, and its credit is to be taken again."""
        if self.mark < no <= self.through:
            x, (done, done_context) = self.x, self.credit
            self.x = (max(0.0, x[0] - done + tokens) + done, x[1], x[2], x[3],
                      max(0.0, x[4] - done_context + context) + done_context)  # fmt: skip
        elif self.queued and no > self.through and 0 < seq <= self.queue_seq:
            self.queued = max(0.0, self.queued + tokens)
            self.queued_context = max(0.0, self.queued_context + context)
            return True
        return False


def add_observations(
    a: list[list[float]],
    c: list[float],
    windows: Iterable[Sequence[Obs]],
    theta: list[float],
    factor: float,
    slacks: Sequence[float] = (),
    compiled: bool = True,
) -> int:
    """Add each window's observations to the normal equations ``a``, ``c`` (in place), each
    divided by its prediction at ``theta`` (relative errors), leaving out those more than
    ``factor`` off the window's typical misprediction; returns how many were left out.

    ``slacks``, one per window (missing: 0): tokens by which each of the window's token counts
    may be off whatever its size. An observation's error is then judged against its prediction
    plus their time at ``theta`` (an absolute floor under the relative error), so that a short
    observation whose count such an error swamps weighs less; the outlier test still compares
    the prediction alone.

    Compiled (``_native``, ``solve.c``) when built, with the same result to the bit; the Python
    below is its reference (``compiled=False`` runs it)."""
    windows = tuple(windows)
    floors = [max(0.0, s) * theta[0] for s in slacks[: len(windows)]]  # seconds
    floors += [0.0] * (len(windows) - len(floors))
    if compiled and _native.add_observations is not None:
        dropped: int | None = _native.add_observations(a, c, windows, theta, factor, floors)
        if dropped is not None:  # else a ratio was not a number: the reference decides
            a[1][0] = a[0][1]
            return dropped
    dropped = 0
    for window, floor in zip(windows, floors, strict=False):
        if window:
            dropped += _add_window(a, c, window, theta, factor, floor)
    a[1][0] = a[0][1]
    return dropped


def _add_window(
    a: list[list[float]], c: list[float], window: Sequence[Obs], theta: list[float], factor: float,
    floor: float = 0.0,
) -> int:
    """One window of :func:`add_observations` (in Python), ``floor`` seconds added to each
    prediction as the scale of its error; returns how many it left out."""
    # Unrolled, not ``sum(zip(...))``: a refit reads every observation twice and runs every
    # few requests per replica (36% of a simulator run under round_robin was these loops as
    # first written; solve.c). The sums are taken in the same order: the same to the bit.
    t0, t1, t2, t3, t4 = theta
    preds: list[float] = []
    ratios: list[float] = []
    for o in window:
        x0, x1, x2, x3, x4 = o.x
        p = x0 * t0 + x1 * t1 + x2 * t2 + x3 * t3 + x4 * t4
        if p < 1e-9:
            p = 1e-9
        preds.append(p)
        ratios.append(o.seconds / p)
    # The typical misprediction, among the newer half: a change of speed becomes the norm
    # once it is half of that, and is no longer taken for a run of outliers.
    recent = sorted(ratios[len(ratios) // 2 :])
    centre = recent[len(recent) // 2]
    low, high = centre / factor, centre * factor
    dropped = 0
    a00, a01, a11, c0, c1 = a[0][0], a[0][1], a[1][1], c[0], c[1]
    for o, p, r in zip(window, preds, ratios, strict=True):
        if not low <= r <= high:
            dropped += 1
            continue
        ox = o.x
        if floor:  # judged against prediction + floor; without one, exactly as before
            p += floor
            r = o.seconds / p
        x, k = ox[0] / p, ox[1] / p
        a00 += x * x
        a01 += x * k
        a11 += k * k
        c0 += x * r
        c1 += k * r
        if ox[2] or ox[3] or ox[4]:  # the other columns, where the observation has them
            row = (x, k, ox[2] / p, ox[3] / p, ox[4] / p)
            for i in (2, 3, 4):
                if ox[i]:
                    for j in range(5):
                        a[i][j] += row[i] * row[j]
                        if j < 2:
                            a[j][i] += row[i] * row[j]
                    c[i] += row[i] * r
    a[0][0], a[0][1], a[1][1], c[0], c[1] = a00, a01, a11, c0, c1
    return dropped


def solve_feasible(
    a: list[list[float]], c: list[float], current: list[float], free: list[int],
    compiled: bool = True,
) -> list[float]:
    """The least-squares solution of ``a theta = c`` over the unknowns in ``free`` (the others
    stay at ``current``), with ``1/rate`` (unknown 0) positive and the rest not negative: an
    unknown the solution makes infeasible is fixed (a step or overhead at 0; the rate at its
    current value: no time left for prefill) and the rest solved again.

    Compiled (``solve.c``, five unknowns) when built, to the bit; the Python below is its
    reference (``compiled=False`` runs it) and solves any number."""
    if compiled and _native.solve_feasible is not None and len(current) == 5:  # the model's
        return _native.solve_feasible(a, c, current, free)
    fixed = {i: v for i, v in enumerate(current) if i not in free}
    theta = list(current)
    for _ in range(len(current)):
        free = [i for i in range(len(current)) if i not in fixed]
        if not free:  # every unknown fixed: the last solve's infeasible values stay out
            return [fixed[i] for i in range(len(current))]
        rhs = []
        for i in free:
            # A loop, not sum(): Python 3.12's sum() of floats compensates its rounding, and
            # solve.c adds in order, as 3.11's sum() did (the digests stay the same).
            known = 0.0
            for j, v in fixed.items():
                if v:
                    known += a[i][j] * v
            rhs.append(c[i] - known)
        sol = _gauss([[a[i][j] for j in free] for i in free], rhs)
        if sol is None:
            return current
        theta = [fixed.get(i, 0.0) for i in range(len(current))]
        for i, v in zip(free, sol, strict=True):
            theta[i] = v
        bad = [i for i in free if (theta[i] <= 0 if i == 0 else theta[i] < 0)]
        if not bad:
            return theta
        for i in bad:
            fixed[i] = current[0] if i == 0 else 0.0
    return theta


def _gauss(a: list[list[float]], c: list[float]) -> list[float] | None:
    """``a x = c`` by Gaussian elimination with partial pivoting; None when ``a`` is singular."""
    n = len(c)
    if n == 2:  # Cramer's rule: the two-unknown fit's arithmetic, exactly as it always was
        det = a[0][0] * a[1][1] - a[0][1] * a[0][1]
        if det <= 0:
            return None
        return [(c[0] * a[1][1] - c[1] * a[0][1]) / det, (a[0][0] * c[1] - a[0][1] * c[0]) / det]
    m = [[*row, rhs] for row, rhs in zip(a, c, strict=True)]
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(m[i][k]))
        if abs(m[p][k]) < 1e-300:
            return None
        m[k], m[p] = m[p], m[k]
        for i in range(k + 1, n):
            f = m[i][k] / m[k][k]
            for j in range(k, n + 1):
                m[i][j] -= f * m[k][j]
    x = [0.0] * n
    for k in range(n - 1, -1, -1):
        known = 0.0  # a loop, not sum() (solve_feasible)
        for j in range(k + 1, n):
            known += m[k][j] * x[j]
        x[k] = (m[k][n] - known) / m[k][k]
    return x
