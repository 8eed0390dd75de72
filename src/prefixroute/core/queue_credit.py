"""The progress a replica made on its prefill queue, credited to the speed model's observations
at the estimates of the moment, and taken again at each refit (:mod:`prefixroute.core.speed`).

**A first token's queue.** The queued tokens counted at dispatch include the part of the head
request the replica has already prefilled. Counting it in full makes the wait look longer than it
is, and a rate fitted on it comes out too high on lightly loaded fast replicas (+25% in the
simulator under round robin). So the load view keeps ``busy_since``, when the replica started on
its current queue (the first dispatch to an idle replica, or the last first token while work
remained), and credits the replica with ``rate x (elapsed - one decode step per step started)``
tokens of progress, never more than is queued (``ReplicaSpeed.progress``). That credit is taken
at the estimates of the moment, so a first token's observation keeps the queue it waited behind
(``QueuedObs``) and each refit takes it again at the estimates it starts from. Taken once at
dispatch, a replica misjudged while cold kept the misjudgement (a slow one started fast looked to
have a 353 ms fixed overhead, and was hardly sent anything). The queue is the requests ahead's
*predicted* uncached tokens; their usage reports correct it, for observations taken and to come
(``ReplicaSpeed.correct_queue``, :mod:`prefixroute.core.queue_fixes`), and so the prefill
counted in decode phases (``ReplicaSpeed.correct_decode``).

**A decode phase's last prefill.** A decode phase counts the uncached tokens of the requests
whose first tokens came back during it. When it ends with a prompt still prefilling (a backlog),
its last steps carried chunks of that prompt, whose first token comes after it: uncounted, they
made the phase look slow for its work, the fit took a longer decode step to explain it, and then
a higher rate to explain the first tokens with that step. On the synthetic Mooncake trace at
1.0-1.2x capacity in the simulator, one fast replica in 80 runs was learned at 8.6x its rate,
five more at 2.5-6.1x (of 320 estimates). So a phase that ends with prefill under way
keeps that queue as a first token does (``PhaseObs``), and is credited with the progress on it,
taken again at each refit. That queue is the predicted uncached tokens of the requests in it:
the usage of each corrects it once reported, as it corrects the queues of the first tokens sent
behind it (``ReplicaSpeed.correct_decode``; a request was in it when it was dispatched by the
phase's end and its first token came after). Over 80 such runs the estimates over 1.3x off went
from 29 to 7, the worst from 8.6x to 2.9x (docs/results.md, *Learning under a backlog*).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prefixroute.core._solve import Obs, PhaseObs, QueuedObs

if TYPE_CHECKING:
    from prefixroute.core.speed import ReplicaSpeed

REDERIVE_TOLERANCE = 0.01  # estimates moved this much (relative): a queue's work is taken again


def derive(speed: ReplicaSpeed, obs: QueuedObs) -> None:
    """``obs``'s work from its queue, at ``speed``'s estimates of the moment (its
    ``queue_work``)."""
    tokens, steps, context = speed.queue_work(
        obs.queued, obs.elapsed_s, obs.decoding, obs.own, obs.queued_context, obs.own_context
    )
    if obs.after is not None:  # an answer that came whole: its decode phase too
        more, more_steps, more_context = obs.after
        tokens, steps, context = tokens + more, steps + more_steps, context + more_context
    obs.x = (tokens, steps, 0.0, 1.0, context)
    obs.basis = (speed.prefill_tokens_per_s, speed.decode_step_s, speed.attention_s)


def credit(speed: ReplicaSpeed, obs: PhaseObs) -> None:
    """``obs``'s work with the progress on the prefill under way at its end, at ``speed``'s
    estimates of the moment, in place of the credit it had (the queue's context work in
    proportion)."""
    # Its steps carried decodes all along: its own, at least.
    done = speed.progress(obs.queued, obs.elapsed_s, True, obs.queued_context)
    # A queue its requests' usage emptied (they computed nothing) is credited nothing.
    context = obs.queued_context * done / obs.queued if obs.queued > 0 else 0.0
    x, (before, before_context) = obs.x, obs.credit
    # A phase's x: (tokens, steps, no engine request, no first token, context work).
    obs.x = (x[0] - before + done, x[1], 0.0, 0.0, x[4] - before_context + context)
    obs.credit = (done, context)
    obs.basis = (speed.prefill_tokens_per_s, speed.decode_step_s, speed.attention_s)


def rederive(
    speed: ReplicaSpeed, first_tokens: Iterable[Obs], phases: Iterable[PhaseObs]
) -> None:
    """Take each queue of ``first_tokens`` and ``phases`` again at ``speed``'s current
    estimates, where they moved by more than ``REDERIVE_TOLERANCE`` since it was last taken (a
    queue with nothing credited does not depend on them)."""
    rate, step, attention = speed.prefill_tokens_per_s, speed.decode_step_s, speed.attention_s
    tol = REDERIVE_TOLERANCE

    def moved(basis: tuple[float, float, float]) -> bool:
        r0, d0, a0 = basis
        # Attention judged against a token's time at the rate: its prior is 0.
        return not (abs(rate - r0) <= tol * r0 and abs(step - d0) <= tol * d0
                    and abs(attention - a0) <= tol * (1.0 / r0 + a0))  # fmt: skip

    for o in first_tokens:
        if type(o) is QueuedObs and o.queued and o.elapsed_s > 0 and moved(o.basis):
            derive(speed, o)
    for p in phases:
        if p.queued and moved(p.basis):
            credit(speed, p)
