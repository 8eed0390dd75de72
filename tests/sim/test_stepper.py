"""One replica's step loop on a kernel, as the simulator and the emulator both run it."""

from __future__ import annotations

from prefixroute.sim.kernel import Kernel
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel, StepResult
from prefixroute.sim.stepper import ReplicaStepper

CFG = ReplicaConfig(
    kv_capacity_blocks=256, block_size=1, step_tokens=64, prefill_tokens_per_s=100.0
)


class Steps:
    """What on_step heard: (kernel time, first tokens, finished) per applied step."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.seen: list[tuple[float, list[str], list[str]]] = []

    def __call__(self, result: StepResult) -> None:
        first = [r.request_id for r in result.first_tokens]
        self.seen.append((self.kernel.now, first, [r.request_id for r in result.finished]))


def request(rid: str, prompt: int, output: int) -> EngineRequest:
    return EngineRequest(rid, list(range(prompt)), output, arrival_s=0.0)


def rig(
    config: ReplicaConfig = CFG, *, empty_steps: bool = False, **model_kw: bool
) -> tuple[Kernel, ReplicaModel, Steps, ReplicaStepper]:
    """A kernel, a model, and a stepper that records each step it applies."""
    k = Kernel()
    model = ReplicaModel(config, **model_kw)
    steps = Steps(k)
    stepper = ReplicaStepper(k, model, steps, empty_steps=empty_steps)
    return k, model, steps, stepper


def test_a_kick_steps_the_model_back_to_back_until_it_runs_out_of_work() -> None:
    k, model, steps, stepper = rig()
    model.submit(request("a", 10, 3))
    stepper.kick()
    stepper.kick()  # kicking a replica that is already stepping plans nothing twice
    k.run()
    # 10 prompt tokens at 100 tokens/s, then two decode steps of 15 ms
    assert [round(t, 6) for t, _, _ in steps.seen] == [0.1, 0.115, 0.13]
    assert steps.seen[0][1] == ["a"] and steps.seen[-1][2] == ["a"]
    assert not stepper.stepping and not stepper.in_step
    assert k.processed == 4  # one begin, then an end per step (each end plans the next)


def test_in_step_holds_from_the_plan_to_the_end() -> None:
    k = Kernel()
    model = ReplicaModel(CFG)
    stepper = ReplicaStepper(k, model, lambda result: None)
    model.submit(request("a", 10, 1))
    stepper.kick()
    assert stepper.stepping and not stepper.in_step  # kicked, not planned yet
    k.step()  # the plan
    assert stepper.in_step
    k.step()  # its end
    assert not stepper.in_step and not stepper.stepping


def test_on_plan_hears_how_many_requests_a_step_admitted() -> None:
    one_at_a_time = ReplicaConfig(kv_capacity_blocks=64, block_size=1, max_running=1)
    k = Kernel()
    model = ReplicaModel(one_at_a_time)
    admitted: list[int] = []
    stepper = ReplicaStepper(k, model, lambda result: None, on_plan=admitted.append)
    model.submit(request("a", 10, 2))
    model.submit(request("b", 10, 2))
    stepper.kick()
    k.run()
    assert admitted == [1, 0, 1, 0]  # a's prefill, a's decode, then b's (the batch holds one)


def test_a_zero_second_plan_idles_the_simulator_and_is_applied_by_the_emulator() -> None:
    no_decode_time = ReplicaConfig(kv_capacity_blocks=64, block_size=1, decode_step_s=0.0)
    for empty_steps, finished in ((False, []), (True, ["a"])):
        k, model, steps, stepper = rig(no_decode_time, empty_steps=empty_steps)
        model.submit(request("a", 4, 3))
        stepper.kick()
        k.run()
        assert [rid for _, _, done in steps.seen for rid in done] == finished
        assert not stepper.stepping
        assert model.has_work() is not empty_steps  # the simulator left it stuck, as recorded


def test_a_kick_with_nothing_left_to_do_plans_no_step() -> None:
    k, model, steps, stepper = rig(empty_steps=True)
    model.submit(request("a", 4, 3))
    stepper.kick()
    model.abort("a")  # gone before the kick's event ran
    k.run()
    assert steps.seen == [] and not stepper.stepping


def test_an_arrival_cuts_a_fast_forwarded_decode_stretch_and_the_old_end_is_ignored() -> None:
    k, model, steps, stepper = rig(fast_forward=True, report_decodes=False)
    model.submit(request("long", 10, 101))  # 100 decode steps after its prefill
    stepper.kick()
    k.run(until=0.5)  # prefill ended at 0.1; one planned step stands for the whole stretch

    def arrive() -> None:
        model.submit(request("short", 1, 1))
        stepper.kick()

    k.at(0.5, arrive)
    k.run()
    times = [round(t, 6) for t, _, _ in steps.seen]
    # The stretch ends at the first step boundary after the arrival, 0.1 + 27 * 0.015, not 1.6;
    # the end still on the heap for 1.6 is stale and does nothing.
    assert times[:3] == [0.1, 0.505, 0.53]  # the arrival's step: its prefill plus one decode
    assert steps.seen[2][1] == ["short"]
    assert times[-1] == 1.61  # the 72 decode steps "long" had left, then it finishes
    assert stepper.generation == 1 and [d for _, _, d in steps.seen if d] == [["short"], ["long"]]
    assert len(times) == 4  # prefill, cut stretch, the arrival's step, the rest of the stretch
