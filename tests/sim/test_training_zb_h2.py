"""ZB-H2 with post-validation (Qi et al. ICLR'24, arXiv 2401.10241, Sec. 4): no barrier before the
optimizer step, so iterations interlock and the iteration time is the longest stage span. Against the
published closed forms (bubble (p - 1)(F + B - 2W), zero when F = B = W; activations (2p - 1) M_B,
about twice 1F1B's p M_B), against a DES run of two consecutive iterations as one program, and on the
paper's setting from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.training.analytic import analytic_iteration
from sim.training.pipeline_des import run_pipeline
from sim.training.schedules import program_profile, stage_program, tiles_iterations
from tests.sim.test_training_schedule_programs import uniform

CASES = [(4, 8), (8, 32), (4, 16)]


@pytest.mark.parametrize(("pp", "m"), CASES)
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 2.0, 0.5)])
def test_bubble_against_the_closed_form(pp: int, m: int, f: float, b: float, w: float) -> None:
    """Qi et al. Table 2: ZB-H2 idles (p - 1)(F + B - 2W) per stage (F + B >= 2W), ZB-H1 (p - 1)(F + B - W)."""
    work = uniform("zb-h2", pp, m, 1, f, b, w)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    expected = m * (f + b + w) + (pp - 1) * (f + b - 2 * w)
    assert des.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert analytic.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert des.bubble_fraction == pytest.approx(1 - m * (f + b + w) / expected, abs=1e-12)
    assert analytic.bubble_fraction == pytest.approx(des.bubble_fraction, abs=1e-12)
    zb_h1 = run_pipeline(uniform("zb-h1", pp, m, 1, f, b, w)).iteration_time_s
    assert zb_h1 == pytest.approx(m * (f + b + w) + (pp - 1) * (f + b - w), rel=1e-12)
    if f == b == w:
        assert des.bubble_fraction == 0.0 and zb_h1 > des.iteration_time_s


@pytest.mark.parametrize(("pp", "m"), CASES[:2])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0)])
def test_two_iterations_run_back_to_back_take_one_period_more(tmp_path: Path, pp: int, m: int, f: float, b: float, w: float) -> None:
    """The period is real: two iterations as one program (each stage runs its first iteration's ops,
    then its second's, with no barrier) end exactly one ZB-H2 iteration time after one iteration."""
    stages = []
    for s in range(pp):
        ops = stage_program("zb-h2", pp, s, m)
        stages.append([[op.kind, op.microbatch + k * m, 0] for k in (0, 1) for op in ops])
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"stages": stages, "split_backward": True}))
    two = run_pipeline(uniform(f"file:{path}", pp, 2 * m, 1, f, b, w))
    assert not tiles_iterations(f"file:{path}")  # one program: its makespan, no tiling assumed
    one = run_pipeline(uniform("zb-h2", pp, m, 1, f, b, w))
    assert two.pipeline_time_s - one.pipeline_time_s == pytest.approx(one.iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("pp", [4, 8, 16])
def test_activations_twice_one_f_one_b(pp: int) -> None:
    """(2p - 1) micro-batches in flight on stage 0 against 1F1B's p: about 2x (Qi et al. Table 2)."""
    m = 4 * pp
    assert max(program_profile("zb-h2", pp, m).peak_held_chunks) == 2 * pp - 1
    assert max(program_profile("1f1b", pp, m).peak_held_chunks) == pp
    des = run_pipeline(uniform("zb-h2", pp, m, 1, 1.0, 1.0, 1.0))
    assert max(des.peak_activation_bytes) == 2 * pp - 1


def test_paper_setting_from_the_cli() -> None:
    """Llama-2 7B, 8 A100, pp 8, 32 micro-batches (examples/train-zb-h1.toml): ZB-H2 beats ZB-H1 and
    1F1B in both fidelities and holds (2p - 1)/p of 1F1B's activations."""
    from sim.config import load_config
    from sim.runner import RunOptions, simulate

    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "train-zb-h1.toml")
    out = {}
    for schedule in ("1f1b", "zb-h1", "zb-h2"):
        config["parallel"]["schedule"] = schedule
        out[schedule] = {f: simulate(config, RunOptions(fidelity=f)).metrics() for f in ("analytic", "des")}
    for fidelity in ("analytic", "des"):
        t = {s: out[s][fidelity]["iteration_time_s"] for s in out}
        assert t["zb-h2"] < t["zb-h1"] < t["1f1b"]
        assert t["1f1b"] / t["zb-h2"] == pytest.approx(1.186, abs=0.02)
    assert out["zb-h2"]["des"]["iteration_time_s"] == pytest.approx(out["zb-h2"]["analytic"]["iteration_time_s"], rel=0.01)
    ratio = out["zb-h2"]["des"]["memory_bytes"]["activations"] / out["1f1b"]["des"]["memory_bytes"]["activations"]
    assert ratio == pytest.approx(15 / 8, rel=0.01)
