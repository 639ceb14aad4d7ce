"""Host dispatch (``host_forward_op_us`` / ``host_backward_op_us``): the closed form of a pass whose
ops a host issues one by one (``sim.training.work.host_bound_pass_s``) against exact tiny timelines
and an event-by-event SimPy run, its chaining over layers, the two fidelities agreeing on a
host-bound run, and bad values as one error line."""

from __future__ import annotations

import copy
import itertools

import pytest
import simpy

from sim.cli import main
from sim.config import with_overrides
from sim.runner import RunOptions
from sim.training.run import simulate_training
from sim.training.work import chain_host_bound, host_bound_pass_s


def _simpy_end(gpu_s: list[float], host_s: list[float]) -> float:
    """The GPU's end when a host process issues op i after host_s[i] and a GPU process starts each
    op once it is issued and the previous op is done (start_i = max(gpu_free, issued_i))."""
    env = simpy.Environment()
    issued = [env.event() for _ in gpu_s]
    ends: list[float] = []

    def host():
        for i, seconds in enumerate(host_s):
            yield env.timeout(seconds)
            issued[i].succeed()

    def gpu():
        for i, seconds in enumerate(gpu_s):
            yield issued[i]
            yield env.timeout(seconds)
        ends.append(env.now)

    env.process(host())
    env.process(gpu())
    env.run()
    return ends[0]


def test_three_ops_host_faster_than_each_op() -> None:
    # host 1 s per op, GPU ops 5, 2, 3 s: the GPU waits only for the first issue
    assert host_bound_pass_s([5.0, 2.0, 3.0], [1.0] * 3) == 1.0 + 5.0 + 2.0 + 3.0


def test_three_ops_host_slower_than_each_op() -> None:
    # host 4 s per op, GPU ops 1, 2, 3 s: every op waits for its issue; the last ends at 3 x 4 + 3
    assert host_bound_pass_s([1.0, 2.0, 3.0], [4.0] * 3) == 3 * 4.0 + 3.0


def test_three_ops_mixed() -> None:
    # host 2 s per op, GPU ops 1, 6, 1 s: op 0 runs 2-3, op 1 issued at 4 runs 4-10, op 2 issued at 6 runs 10-11
    assert host_bound_pass_s([1.0, 6.0, 1.0], [2.0] * 3) == 11.0
    assert _simpy_end([1.0, 6.0, 1.0], [2.0] * 3) == 11.0


@pytest.mark.parametrize("gpu_s, host_s", [
    ([3.0, 0.5, 0.5, 4.0, 0.25], [1.0, 1.0, 1.0, 1.0, 1.0]),
    ([0.1, 0.2, 0.3], [0.5, 0.25, 0.125]),
    ([2.0], [3.0]),
    ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]),
])
def test_closed_form_is_the_event_by_event_timeline(gpu_s: list[float], host_s: list[float]) -> None:
    assert host_bound_pass_s(gpu_s, host_s) == pytest.approx(_simpy_end(gpu_s, host_s), rel=1e-12)


def test_chaining_is_the_timeline_of_the_joined_sequence_and_associative() -> None:
    parts = [([3.0, 0.5], [1.0, 1.0]), ([0.2, 0.2, 0.2], [1.0, 1.0, 1.0]), ([4.0], [0.5])]
    triples = [(sum(g), sum(h), host_bound_pass_s(g, h)) for g, h in parts]
    joined = host_bound_pass_s([x for g, _ in parts for x in g], [x for _, h in parts for x in h])
    left = chain_host_bound(chain_host_bound(triples[0], triples[1]), triples[2])
    right = chain_host_bound(triples[0], chain_host_bound(triples[1], triples[2]))
    assert left[2] == pytest.approx(joined, rel=1e-12)
    assert right == pytest.approx(left, rel=1e-12)


@pytest.mark.parametrize("host", [0.5, 2.0])
def test_identical_layers_cost_the_first_plus_max_of_host_and_gpu(host: float) -> None:
    layer_gpu, layers = [1.0, 0.25, 0.5], 6
    one = (sum(layer_gpu), host * 3, host_bound_pass_s(layer_gpu, [host] * 3))
    chained = one
    for _ in range(layers - 1):
        chained = chain_host_bound(chained, one)
    assert chained[2] == pytest.approx(one[2] + (layers - 1) * max(one[0], one[1]), rel=1e-12)
    assert chained[2] == pytest.approx(_simpy_end(layer_gpu * layers, [host] * 3 * layers), rel=1e-12)


BASE = {
    "model": {"hidden": 512, "layers": 4, "heads": 8, "kv_heads": 8, "ffn_hidden": 2048, "vocab": 32000, "activation": "gelu"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 2},
    "training": {"seq_len": 512, "global_batch": 8, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 1, "pp": 2, "recompute": "none"},
}


def _run(fidelity: str, **overrides: object) -> float:
    config = with_overrides(copy.deepcopy(BASE), [f"{k}={v}" for k, v in overrides.items()])
    return simulate_training(config, RunOptions(fidelity=fidelity)).metrics()["iteration_time_s"]


def test_host_bound_small_model_is_slower_and_the_fidelities_agree() -> None:
    off = {f: _run(f, **{"training.host_forward_op_us": 0, "training.host_backward_op_us": 0}) for f in ("analytic", "des")}
    on = {f: _run(f, **{"training.host_forward_op_us": 200, "training.host_backward_op_us": 100}) for f in ("analytic", "des")}
    assert on["analytic"] > 1.5 * off["analytic"]  # tiny kernels: the host sets the pace
    assert on["des"] == pytest.approx(on["analytic"], rel=0.01)
    assert off["des"] == pytest.approx(off["analytic"], rel=0.01)


def test_more_host_time_is_never_faster() -> None:
    times = [_run("analytic", **{"training.host_forward_op_us": h, "training.host_backward_op_us": h})
             for h in (0, 5, 20, 80)]
    assert all(a <= b for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("key", ["host_forward_op_us", "host_backward_op_us"])
def test_a_negative_host_cost_is_one_error_line(key: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.toml"
    path.write_text('[model]\nname = "gpt3-1.7b"\n[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 1\n'
                    '[training]\nseq_len = 2048\nglobal_batch = 1\nmicro_batch = 1\n')
    assert main(["simulate", str(path), "--set", f"training.{key}=-2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: [training] {key} = -2 must be a number >= 0"
