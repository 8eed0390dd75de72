"""One request in flight, as the load view keeps it from dispatch to its end: what it was
predicted to cost, the queue it joined, and what it teaches its replica's speed model (the
load view's module docstring says when)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixroute.core.context_cost import context_work
from prefixroute.core.speed import QueuedObs
from prefixroute.core.types import ReplicaId

MISJUDGED = 2.0  # a warming replica's first token this many times off its prediction teaches now

if TYPE_CHECKING:  # the load view imports this module
    from prefixroute.core.replica_load import ReplicaLoad


@dataclass(slots=True)
class InFlight:
    replica: ReplicaId
    load: ReplicaLoad  # the load it was counted in (survives the replica's removal and re-adding)
    uncached_tokens: int  # predicted prefill work, tokens
    output_tokens: int  # expected output, tokens
    blocks: int  # KV blocks reserved in the view, blocks
    dispatched_s: float = 0.0  # when it was sent, seconds
    # The queue ahead of it at dispatch: what is left of it is taken at the speed model's
    # estimates each time it is needed (``ReplicaSpeed.queue_work``), not once.
    queued_ahead: float = 0.0  # prefill tokens queued ahead, progress not credited, tokens
    queue_elapsed_s: float = 0.0  # how long the replica had been on that queue, seconds
    decoding: bool = False  # the replica was decoding at dispatch
    # Context work (core/context_cost.py): its own, predicted, and the queue's ahead of it.
    context: float = 0.0  # token-kilotokens
    context_ahead: float = 0.0  # token-kilotokens
    prefilled: bool = False
    prefill_no: int = 0  # its place among the replica's first tokens (core/queue_fixes.py)
    phase_mark: int = 0  # the replica's first tokens by its own: its decode phase's start
    first_token_s: float | None = None  # measured first token, seconds (None: not measured)
    prefilled_mark: int = 0  # the replica's ``prefilled_tokens`` at its first token, tokens
    prefilled_context_mark: float = 0.0  # and its ``prefilled_context``, token-kilotokens
    actual_uncached: int | None = None  # uncached tokens the replica reported, tokens
    predicted_cached: int = 0  # cached tokens predicted at dispatch, tokens
    key_block_tokens: float = 0.0  # one block of the request's key, in tokens (a prediction's step)
    ttft_learned: bool = False  # its first token taught the speed model already (warm-up)
    ttft_obs: QueuedObs | None = None  # what it taught, corrected by the reported count
    seq: int = 0  # its place among the replica's dispatches (core/queue_fixes.py)
    through: int = 0  # the replica's dispatches by its first token: those behind it
    sequences: int = 1  # output sequences it asks for (RequestView): 1 teaches a decode step
    batch: bool = False  # several prompts (RequestView): its usage is not this prompt's
    dispatched_mark: int = 0  # the replica's ``dispatched_tokens`` with it dispatched, tokens
    dispatched_context_mark: float = 0.0  # and its ``dispatched_context``, token-kilotokens
    queue_known: bool = True  # its queue ahead at dispatch is no overcount (learn_whole)
    unseen: bool = False  # its first token will not be seen (a plain answer: first_token_due)
    rechecks: int = 0  # its guess put off with the work ahead overdue (core/plain_answers.py)
    # Sent to a full batch: it waited for a slot as well as for the queue, a wait the speed
    # model has no term for, so its first token teaches no prefill rate (core/batch_slots.py).
    slot_wait: bool = False

    def misjudged(self) -> bool:
        """A replica still warming up whose first token came more than ``MISJUDGED`` times
        sooner or later than predicted: it teaches now, not at the request's end (module
        docstring)."""
        speed = self.load.speed
        if speed.warmed_up or not speed.config.learn or self.first_token_s is None:
            return False
        if self.slot_wait:  # it waited for a slot: no measure of the speed (learn)
            return False
        predicted = self.predicted_ttft()
        measured = self.first_token_s - self.dispatched_s
        return not predicted / MISJUDGED <= measured <= predicted * MISJUDGED

    def predicted_ttft(self) -> float:
        """Its first token's time after dispatch, at its replica's current estimates, with its
        predicted uncached tokens, seconds."""
        return self.load.speed.ttft_s(*self.ttft_work(self.uncached_tokens))

    def ttft_work(self, own: int) -> tuple[float, float, float]:
        """(tokens, decode steps, context work) the request's first token waited for, with
        ``own`` uncached tokens of its own, at the replica's current estimates: the arguments of
        ``ReplicaSpeed.ttft_s``."""
        speed = self.load.speed
        return speed.queue_work(
            self.queued(), self.queue_elapsed_s, self.decoding, own,
            self.context_ahead, self.own_context(own),
        )  # fmt: skip

    def own_context(self, own: int) -> float:
        """Its own context work had ``own`` of its prompt's tokens been uncached."""
        if own == self.uncached_tokens:
            return self.context
        return context_work(self.predicted_cached + self.uncached_tokens - own, own)

    def queued(self) -> float:
        """The work queued ahead of the request at dispatch, with what is known of how much the
        requests in it really computed (core/queue_fixes.py), tokens."""
        return max(0.0, self.queued_ahead + self.load.fixes.ahead_of(self.seq))

    def learn_ttft(self) -> QueuedObs | None:
        """Its measured first token teaches its replica's speed model (what it taught)."""
        assert self.first_token_s is not None
        own = self.uncached_tokens if self.actual_uncached is None else self.actual_uncached
        return self.load.speed.observe_first_token(
            self.queued(), self.queue_elapsed_s, self.decoding, own,
            self.first_token_s - self.dispatched_s, seq=self.seq,
            queued_context=self.context_ahead, own_context=self.own_context(own),
        )  # fmt: skip

    def learn(self, now: float, output_tokens: int | None) -> None:
        """At its end (``now``), a request with a measured first token teaches its first token
        (unless it already did, when its replica's own count corrects that) and its decode
        phase, from ``output_tokens``."""
        assert self.first_token_s is not None
        speed = self.load.speed
        if not (self.ttft_learned or self.slot_wait):
            self.learn_ttft()
        elif self.ttft_obs is not None and self.actual_uncached is not None:
            # Taught at its first token with the predicted uncached tokens: the replica's own
            # count corrects that observation (a wrong cache prediction is not a wrong speed).
            actual = self.actual_uncached
            speed.correct_prefill(self.ttft_obs, actual, self.own_context(actual))
        # Several sequences decode side by side: their tokens are no count of steps.
        if output_tokens is not None and output_tokens > 1 and self.sequences == 1:
            load = self.load
            # Those prefilled meanwhile, with what their usage said they really computed.
            fixed, fixed_context = load.phase_fixes.within(self.phase_mark)
            prefilled = load.prefilled_tokens - self.prefilled_mark + fixed
            context = load.prefilled_context - self.prefilled_context_mark + fixed_context
            # Its last steps also carried the prefill under way now (core/queue_credit.py), and
            # its own decodes: it decoded all along since the replica started on that queue.
            queue = None
            if load.prefilling:
                queue = (load.queued_prefill_tokens, now - load.busy_since, load.queued_context,
                         load.fixes.dispatches)  # fmt: skip
            speed.observe_decode(now - self.first_token_s, output_tokens - 1, prefilled, context,
                                 (self.phase_mark, load.phase_fixes.prefills), queue)  # fmt: skip

    def learn_whole(self, now: float, output_tokens: int | None) -> None:
        """An answer that came whole teaches its first token and decode phase as one
        observation. Only of one sequence whose output is known: several sequences' tokens
        are no count of steps, and a batch's usage is every prompt's."""
        if output_tokens is None or output_tokens < 1 or self.sequences != 1 or self.batch:
            return
        if self.slot_wait:  # its wait for a slot would go into the rate
            return
        # A queue ahead that counts answers long past their prefill (nobody saw or guessed
        # their first tokens) looks longer than what the request waited for, and the rate
        # fitted on it came out up to 8x too fast (a 5,000 tokens/s replica at 40,000).
        if not self.queue_known:
            return
        own = self.uncached_tokens if self.actual_uncached is None else self.actual_uncached
        # The prefill that shared its decode steps: what was sent there after it (no first
        # token of them need have been seen; the few still queued at its end are a small excess).
        load = self.load
        meanwhile = load.dispatched_tokens - self.dispatched_mark
        context = load.dispatched_context - self.dispatched_context_mark
        load.speed.observe_first_token(
            self.queued(), self.queue_elapsed_s, self.decoding, own,
            now - self.dispatched_s, seq=self.seq, after=(meanwhile, output_tokens - 1, context),
            queued_context=self.context_ahead, own_context=self.own_context(own),
        )  # fmt: skip
