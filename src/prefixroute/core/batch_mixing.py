"""Whether a replica's prefill steps also carry its decodes, learned from its first tokens.

Engines batch differently. vLLM v1 puts prefill chunks and the running requests' decodes in
one step (chunked prefill), so a prompt's first token waits for a decode step per chunk on top
of its prefill: ``steps = chunks + 1/2`` (half the step under way at arrival). SGLang, without
``--enable-mixed-chunk`` (its default), runs a prefill batch alone while the decodes wait, so a
first token waits only for the step under way: ``steps = 1/2``. Fitted with vLLM's steps, such
a replica's first tokens come a decode step sooner than any rate explains, and where a prompt's
new part takes about as long as one decode step (a conversation's next turn) the fit stretched
the rate to cover it: 1.4-1.9x the truth on the simulator's fast replicas, and 2-4x on a
replica written by others.

So now and then (every ``EVERY`` refits, once warmed up with ``LEAST`` first tokens) the model
tries the other kind: it takes every queue again with the other steps (core/queue_credit.py),
fits, and keeps the other kind where it explains the first tokens with under ``MARGIN`` of the
error (the mean of each squared relative error, each capped at 1 so that a stall does not
decide). Otherwise everything is put back as it was. The two kinds differ by a constant where
every prompt fits one chunk, which a learned first-token overhead can also take, so where both
explain the data alike the replica stays as it is: vLLM's steps unless its data say otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prefixroute.core._solve import Obs, PhaseObs, QueuedObs
from prefixroute.core.queue_credit import credit, derive

if TYPE_CHECKING:  # the speed model imports this module
    from prefixroute.core.speed import ReplicaSpeed

EVERY = 4  # refits between tries of the other kind (a try costs about one refit more)
LEAST = 16  # first tokens in the window before the kinds are compared
MARGIN = 0.5  # the other kind is kept if its error is under this share of the current one's


def error(theta: Sequence[float], first_tokens: Sequence[Obs]) -> float:
    """Mean squared relative error of ``theta``'s predictions of ``first_tokens``, each capped
    at 1 (0 with none)."""
    total, n = 0.0, 0
    for o in first_tokens:
        if o.seconds > 0:
            predicted = sum(t * x for t, x in zip(theta, o.x, strict=True))
            total += min((predicted / o.seconds - 1.0) ** 2, 1.0)
            n += 1
    return total / n if n else 0.0


def flip(
    speed: ReplicaSpeed, first_tokens: Sequence[Obs], phases: Sequence[PhaseObs],
    carries_decodes: bool | None = None,
) -> None:
    """Make ``speed`` the other kind (or the kind ``carries_decodes`` says, where it is not
    already) and take every queue of ``first_tokens`` and ``phases`` again with its steps (a
    first token without a queue keeps the steps it was given)."""
    if carries_decodes == speed.carries_decodes:
        return
    speed.carries_decodes = not speed.carries_decodes
    for o in first_tokens:
        if type(o) is QueuedObs:
            derive(speed, o)
    for p in phases:
        if p.queued:
            credit(speed, p)


def try_the_other_kind(
    speed: ReplicaSpeed, first_tokens: Sequence[Obs], phases: Sequence[PhaseObs]
) -> None:
    """After a refit of ``speed``: every ``EVERY`` refits, fit with the other kind of step
    (``carries_decodes`` flipped) and keep it if it explains ``first_tokens`` better by the
    margin (module docstring); ``phases``: the decode phases, whose credit depends on it."""
    speed.mixing_trials += 1
    if speed.mixing_trials < EVERY or len(first_tokens) < LEAST:
        return
    speed.mixing_trials = 0
    now = error(speed.theta(), first_tokens)
    queued = [o for o in first_tokens if type(o) is QueuedObs]
    kept = [(o, o.x, o.basis) for o in queued]
    kept_phases = [(p, p.x, p.credit, p.basis) for p in phases]
    flip(speed, queued, phases)
    theta, outliers = speed.fit()
    bounded = speed.config.within_bounds(1.0 / theta[0], theta[1], theta[2], theta[3], theta[4])
    if error([1.0 / bounded[0], *bounded[1:]], first_tokens) < MARGIN * now:
        speed.set_within_bounds(*bounded)
        speed.outliers = outliers
        speed.kind_changes += 1
        return
    speed.carries_decodes = not speed.carries_decodes  # as it was
    for o, x, basis in kept:
        o.x, o.basis = x, basis
    for p, x, done, basis in kept_phases:
        p.x, p.credit, p.basis = x, done, basis
