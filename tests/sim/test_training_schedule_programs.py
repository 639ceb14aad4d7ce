"""Schedules as programs: the new generators against their published closed forms on uniform stages,
the analytic fidelity against the DES on the same programs, and user schedule files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.training.analytic import analytic_iteration
from sim.training.pipeline_des import run_pipeline
from sim.training.schedules import (
    program_profile,
    schedule_placement,
    schedule_program,
    splits_backward,
    stage_program,
)
from sim.training.work import ChunkWork, PipelineWork, StageWork
from workloads.errors import InvalidPlanError

NEW = [("zb-h2", 1), ("zb-v", 2), ("v-half", 2), ("v-min", 2), ("bfs", 2), ("hanayo", 2), ("hanayo", 4)]


def uniform(schedule: str, pp: int, m: int, v: int, f: float, b: float, w: float) -> PipelineWork:
    """pp stages of v equal chunks; a stage's F, B, W are f, b, w (each chunk 1/v of them)."""
    chunk = ChunkWork(
        forward_s=f / v, backward_input_s=b / v, backward_weight_s=w / v, exposed_comm_s={}, recompute_s=0.0,
        activation_bytes=1.0, send_bytes=0.0, layers=1,
    )
    stages = tuple(
        StageWork(stage=s, chunks=(chunk,) * v, grad_sync=(), param_gather=(), optimizer_s=0.0, static_memory_bytes=0.0)
        for s in range(pp)
    )
    return PipelineWork(
        schedule=schedule, num_microbatches=m, virtual_stages=v, stages=stages,
        p2p_bandwidth_Bps=(float("inf"),) * pp, p2p_latency_s=(0.0,) * pp, overlap_slowdown=1.0,
    )


@pytest.mark.parametrize(("schedule", "v"), NEW)
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 5), (8, 16)])
def test_every_op_once_in_dependency_order(schedule: str, v: int, pp: int, m: int) -> None:
    program = schedule_program(schedule, pp, m, v)
    assert program.split_backward == splits_backward(schedule)
    assert sorted(program.placement) == sorted(list(range(pp)) * v)
    for stage in range(pp):
        ops = stage_program(schedule, pp, stage, m, v)
        position = {(op.kind, op.microbatch, op.chunk): i for i, op in enumerate(ops)}
        assert len(position) == len(ops) == 3 * m * v
        for mb in range(m):
            for c in range(v):
                assert position[("F", mb, c)] < position[("B", mb, c)] < position[("W", mb, c)]


def test_v_and_wave_placements() -> None:
    assert schedule_placement("zb-v", 4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert schedule_placement("hanayo", 3, 4) == (0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0)
    assert schedule_placement("bfs", 3, 2) == (0, 1, 2, 0, 1, 2)


def bubble(schedule: str, pp: int, m: int, v: int, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> float:
    return run_pipeline(uniform(schedule, pp, m, v, f, b, w)).bubble_fraction


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (8, 32), (8, 16)])
def test_bubbles_against_the_closed_forms(pp: int, m: int) -> None:
    one_f_one_b = bubble("1f1b", pp, m, 1)
    assert one_f_one_b == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-9)  # Narayanan et al. 2021
    # ZB-H1 (Qi et al. 2024, Table 1): bubble (p - 1)(F + B - W), a third of 1F1B's with F = B = W
    zb_h1 = bubble("zb-h1", pp, m, 1)
    t_zb_h1 = m * 3 + (pp - 1) * 1
    assert zb_h1 == pytest.approx(1 - 3 * m / t_zb_h1, rel=1e-9)
    assert 0.25 < (zb_h1 * t_zb_h1) / (one_f_one_b * (m + pp - 1) * 3) <= 1 / 3 + 1e-9
    # ZB-V (Qi et al. 2024, Sec. 6): about zero: only the first micro-batch's way down the V,
    # (p - 1) chunk forwards of F / 2, is left idle on the last stage
    zb_v = bubble("zb-v", pp, m, 2)
    fill = (pp - 1) * 0.5
    assert zb_v == pytest.approx(1 - 3 * m / (3 * m + fill), rel=1e-9)
    assert zb_v < one_f_one_b / 4
    # ZB-H2 without the cross-iteration overlap it is never worse than ZB-H1; hanayo's waves beat
    # 1F1B once m >> p (Liu et al. SC'23); bfs with v loops has interleaving's bubble
    assert bubble("zb-h2", pp, m, 1) <= zb_h1 + 1e-12
    assert bubble("zb-h2", pp, m, 1, f=1.0, b=2.0, w=1.0) < bubble("zb-h1", pp, m, 1, f=1.0, b=2.0, w=1.0)
    if m >= 4 * pp:
        assert bubble("hanayo", pp, m, 2) < one_f_one_b
    assert bubble("bfs", pp, m, 2) == pytest.approx((pp - 1) / 2 / (m + (pp - 1) / 2), rel=1e-9)


@pytest.mark.parametrize("pp", [4, 8, 16])
def test_activation_memory_of_the_v_shapes(pp: int) -> None:
    """Qi et al. 2024 (arXiv 2405.15362): V-Half 1/2 and V-Min about 1/3 of 1F1B's peak activations,
    ZB-V the same as 1F1B; counted by executing the programs (stage units)."""
    m = 4 * pp
    peak = {s: max(program_profile(s, pp, m, 2 if s.startswith("v") or s == "zb-v" else 1).inflight_stages(k) for k in range(pp))
            for s in ("1f1b", "zb-v", "v-half", "v-min")}
    assert peak["1f1b"] == pp
    assert peak["zb-v"] == pp
    assert peak["v-half"] == pp / 2
    assert 1 / 3 <= peak["v-min"] / peak["1f1b"] <= 0.4
    # and the DES holds exactly what the program says
    result = run_pipeline(uniform("v-half", pp, m, 2, 1.0, 1.0, 1.0))
    assert max(result.peak_activation_bytes) == pp  # one byte per chunk activation, pp chunks


@pytest.mark.parametrize(("schedule", "v"), [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)] + NEW)
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 2.0, 0.5)])
def test_analytic_matches_the_des_on_uniform_stages(schedule: str, v: int, f: float, b: float, w: float) -> None:
    pp, m = 4, 8
    work = uniform(schedule, pp, m, v, f, b, w)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    assert analytic.iteration_time_s == pytest.approx(des.iteration_time_s, rel=0.01)
    assert analytic.bubble_fraction == pytest.approx(des.bubble_fraction, abs=0.01)


def write(tmp_path: Path, data: object, name: str = "schedule.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return "file:" + str(path)


def test_a_schedule_file_runs_like_the_generator_it_copies(tmp_path: Path) -> None:
    pp, m = 4, 6
    stages = [[f"{k}{mb}" for k, mb, _ in schedule_program("1f1b", pp, m).steps[s]] for s in range(pp)]
    schedule = write(tmp_path, {"stages": stages})
    ours = run_pipeline(uniform(schedule, pp, m, 1, 1.0, 2.0, 0.5))
    reference = run_pipeline(uniform("1f1b", pp, m, 1, 1.0, 2.0, 0.5))
    assert ours.iteration_time_s == reference.iteration_time_s
    assert ours.peak_inflight_microbatches == reference.peak_inflight_microbatches
    # a V from a file, with its own placement and a split backward
    v_steps = schedule_program("zb-v", pp, m, 2).steps
    v_file = write(tmp_path, name="v.json", data={
        "placement": list(schedule_placement("zb-v", pp, 2)), "split_backward": True,
        "stages": [[[k, mb, c] for k, mb, c in ops] for ops in v_steps],
    })
    assert run_pipeline(uniform(v_file, pp, m, 2, 1.0, 1.0, 1.0)).iteration_time_s == pytest.approx(
        run_pipeline(uniform("zb-v", pp, m, 2, 1.0, 1.0, 1.0)).iteration_time_s
    )


@pytest.mark.parametrize(
    ("data", "m", "words"),
    [
        ({"stages": [["F0", "B0", "W0"], ["B0", "F0", "W0"]]}, 1, "before B0.0"),
        ({"stages": [["F0", "B0", "W0"], ["F0", "B0"]]}, 1, "never runs W0.0"),
        ({"stages": [["F0", "B0", "W0", "F0"], ["F0", "B0", "W0"]]}, 1, "twice"),
        ({"stages": [["F0", "B0", "W0", "F1", "B1", "W1"], ["F1", "F0", "B0", "W0", "B1", "W1"]]}, 2, "deadlocks"),
        ({"stages": [["F0", "B0", "W0"], ["F0", "B0", "W0"]], "placement": [0, 0]}, 1, "placement"),
        ({"stages": [["F0", "B0", "W0"], ["F0", "B0", "W0"]]}, 3, "runs 1 micro-batches; this job has 3"),
        ({"stages": [["X0"]]}, 1, "must be a string like"),
        ([1, 2], 1, "needs a JSON object"),
    ],
)
def test_bad_schedule_files_name_the_rule(tmp_path: Path, data: object, m: int, words: str) -> None:
    schedule = write(tmp_path, data)
    with pytest.raises(InvalidPlanError, match=words):
        schedule_program(schedule, 2, m, 1)


def test_profiles_are_cached() -> None:
    assert program_profile("zb-v", 4, 8, 2) is program_profile("zb-v", 4, 8, 2)


def test_breadth_first_gathers_fsdp_parameters_once_per_loop() -> None:
    """Lamy-Poirier 2022 (arXiv 2211.05953): in a breadth-first loop every micro-batch runs a chunk
    back to back, so ZeRO-3 gathers each chunk once per pass instead of once per micro-batch."""
    from dataclasses import replace

    from sim.training.work import CommWork

    gather = CommWork(axis="dp", kind="all_gather", message_bytes=1.0, duration_s=2.0)
    exposed, gathers, times = {}, {}, {}
    for schedule in ("bfs", "interleaved"):
        work = uniform(schedule, 4, 8, 2, 1.0, 1.0, 1.0)
        work = replace(work, stages=tuple(replace(s, param_gather=(gather, gather)) for s in work.stages))
        exposed[schedule] = analytic_iteration(work).exposed_comm_s["dp"]
        des = run_pipeline(work, trace=True)
        gathers[schedule] = sum(1 for e in des.events if e.stage == 0 and e.name.startswith("param_gather"))
        times[schedule] = des.iteration_time_s
    # the DES: one gather per chunk and pass under bfs (2 x 2), one per op otherwise (2 x 2 x 8)
    assert gathers == {"bfs": 4, "interleaved": 32}
    assert times["bfs"] < times["interleaved"]
    # depth-first: 2 passes x 2 chunks x 2 s per micro-batch = 8 s against 3 s of compute, so
    # 8 x 5 s beyond the first gather are exposed; breadth-first: 8 s of gathers per iteration
    # under 24 s of compute, all hidden but the first gather
    assert exposed["bfs"] == pytest.approx(2.0)
    assert exposed["interleaved"] == pytest.approx(2.0 + 8 * (8.0 - 3.0))


@pytest.mark.parametrize("schedule", ["zb-v", "v-half", "v-min", "zb-h1", "hanayo"])
@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_analytic_matches_the_des_with_the_naive_vocabulary_placement(schedule: str, vocab_parallel: bool) -> None:
    """Llama-3 8B, pp 8 (examples/train-vocab-parallel.toml): with the embedding and the LM head on
    their end stages (both on stage 0 in a V) the stages differ by 1.75x; the analytic fidelity's
    longest paths with per-stage op times follow the DES (it was 6-30 % over on the V shapes)."""
    from tests.test_examples_training import EXAMPLES, simulate

    example = EXAMPLES / "train-vocab-parallel.toml"
    sets = (f"parallel.schedule={schedule}", f"parallel.vocab_parallel={str(vocab_parallel).lower()}")
    analytic, des = simulate(example, "analytic", *sets), simulate(example, "des", *sets)
    assert analytic["iteration_time_s"] == pytest.approx(des["iteration_time_s"], rel=0.01)


def test_programs_executed_together_give_the_profiles_of_one_by_one() -> None:
    from sim.training import schedules

    keys = [(s, pp, m, v) for s, v in [("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("zb-v", 2), ("hanayo", 4),
                                       ("bfs", 3), ("zb-h2", 1), ("gpipe", 1)]
            for pp in (1, 2, 3, 4) for m in (4, 5, 8)]
    keys.append(("interleaved", 3, 4, 2))  # invalid (m not a multiple of pp): left out, raises when asked
    alone = {}
    for key in keys:
        try:
            alone[key] = schedules._profile(key, *schedules._checked_program(*key))
        except InvalidPlanError:
            pass
    schedules._PROFILES.clear()
    schedules._GRAPHS.clear()
    schedules._checked_program.cache_clear()
    schedules.prepare_program_profiles(keys)
    assert set(schedules._PROFILES) == set(alone)
    # programs of several chunks per stage were run for their graphs alone: their uniform-stage
    # paths are computed when first read, the others' came with the batched execution
    deferred = {key for key in alone if key[3] > 1}
    assert {key for key, p in schedules._PROFILES.items() if p.uniform_paths is None} == deferred
    assert all(alone[key].uniform_paths is not None for key in alone)
    assert all(schedules._PROFILES[key] == profile for key, profile in alone.items())
    # the dependency graphs recorded with the batched executions are those of the programs alone
    for key, graph in schedules._GRAPHS.items():
        single = schedules._program_graph_alone(*key)
        for name in ("slot", "prev", "dep", "last", "first_dep"):
            assert np.array_equal(getattr(graph, name), getattr(single, name)), (key, name)
        assert len(graph.levels) == len(single.levels)
        assert all(np.array_equal(a, b) for a, b in zip(graph.levels, single.levels)), key
    assert {k for k in alone if k[0] != "gpipe"} <= set(schedules._GRAPHS)  # GPipe's closed form is exact
    with pytest.raises(InvalidPlanError, match="multiple of pp|divisible by pp"):
        program_profile("interleaved", 3, 4, 2)


def _small_programs() -> list:
    """Every named schedule's valid program on 1-5 stages, 1-6 and 9 micro-batches and its chunk counts."""
    from sim.training import schedules

    programs = []
    for schedule in schedules.SCHEDULES:
        chunk_counts = {"interleaved": (1, 2, 3), "bfs": (1, 2, 3), "hanayo": (2, 4)}.get(
            schedule, (2,) if schedule in schedules.V_SHAPES else (1,))
        for pp in range(1, 6):
            for m in (1, 2, 3, 4, 5, 6, 9):
                for v in chunk_counts:
                    try:
                        programs.append(schedules.schedule_program(schedule, pp, m, v))
                    except InvalidPlanError:
                        pass
    return programs


def test_packed_execution_equals_the_row_execution_on_small_programs() -> None:
    """The packed executor (one int64 per path and weighting, one weighting per b + w without
    split_backward) gives the executions and op start steps of the (time, F, B, W) row executor,
    alone and side by side, and falls back to it when its count fields could overflow."""
    from sim.training import schedules

    programs = _small_programs()
    assert len(programs) > 450
    for program in programs:
        packed_steps: list = []
        rows_steps: list = []
        table = schedules._lanes([program])
        packed = schedules._execute_packed([program], table, packed_steps)
        assert packed == schedules._execute_rows([program], table, rows_steps, None), program.schedule
        assert len(packed_steps) == len(rows_steps) == 1  # the step at which each op starts
        assert np.array_equal(packed_steps[0], rows_steps[0])
    # side by side, fused and split programs mixed in one run (all 25 weightings)
    mixed = programs[::7]
    table = schedules._lanes(mixed)
    assert schedules._execute_packed(mixed, table, None) == schedules._execute_rows(mixed, table, None, None)


def test_packed_execution_hands_over_before_its_counts_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.training import schedules

    program = schedules.schedule_program("zb-v", 4, 8, 2)
    expected = schedules._execute_rows([program], schedules._lanes([program]), None, None)
    monkeypatch.setattr(schedules, "_PACKED_STEPS", 10)
    assert schedules._execute_packed([program], schedules._lanes([program]), None) is None
    assert schedules._execute_all([program]) == expected


def _list_schedule_one_by_one(spec) -> np.ndarray:
    """The list scheduler of ``schedules._greedy``'s docstring, event by event in plain Python: at
    every time, each free stage in stage order runs, of the ops whose inputs have arrived, the B of
    the oldest micro-batch on the deepest chunk (F first with ``forward_first``), else an F whose
    activations fit (keeping room for the stage's later chunks), else its oldest pending W."""
    from collections import deque

    from sim.training import schedules

    pp, m, place, limits, split = spec.pp, spec.m, spec.place, spec.limits, spec.split
    chunks = len(place)
    v = chunks // pp
    local = [[g for g in range(chunks) if place[g] == s] for s in range(pp)]
    never = float("inf")
    f_end: dict = {}
    b_end: dict = {}
    next_f, next_b = [[0] * v for _ in range(pp)], [[0] * v for _ in range(pp)]
    held, free = [0] * pp, [0] * pp
    pending = [deque() for _ in range(pp)]
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(pp)]
    b_class, f_class = (1, 0) if spec.forward_first else (0, 1)
    t = 0
    while any(len(ops) < 3 * m * v for ops in out):
        chose = False
        for s in range(pp):
            if free[s] > t:
                continue
            options = []
            for c, g in enumerate(local[s]):
                depth = chunks - 1 - g
                i, j = next_b[s][c], next_f[s][c]
                if i < m and f_end.get((g, i), never) <= t and (g == chunks - 1 or b_end.get((g + 1, i), never) <= t):
                    options.append((b_class, i, depth, c))
                if j < m and (g == 0 or f_end.get((g - 1, j), never) <= t) and held[s] <= limits[s] - 1 - (v - 1 - c):
                    options.append((f_class, j, depth, c))
            if pending[s]:
                options.append((2, 0, 0, -1))
            if not options:
                continue
            klass, mb, _, c = min(options)
            chose = True
            free[s] = t + 1
            if c < 0:
                mb, c = pending[s].popleft()
                out[s].append((schedules.W_CODE, mb, c))
            elif klass == f_class:
                f_end[(local[s][c], mb)] = t + 1
                next_f[s][c] += 1
                held[s] += 1
                out[s].append((schedules.F_CODE, mb, c))
            else:
                b_end[(local[s][c], mb)] = t + (1 if split else 2)
                next_b[s][c] += 1
                held[s] -= 1
                out[s].append((schedules.B_CODE, mb, c))
                if split:
                    pending[s].append((mb, c))
                else:
                    out[s].append((schedules.W_CODE, mb, c))
                    free[s] = t + 2
        if chose:
            t += 1
        else:
            later = [f for f in free if f > t]
            if not later:
                raise InvalidPlanError("stuck")
            t = min(later)
    return np.array(out, dtype=np.int64)


def test_list_scheduler_equals_the_one_by_one_list_scheduler() -> None:
    """``_greedy`` (all stages stepped together as array lanes, several programs side by side, of
    any chunks per stage) makes the choices of the event-by-event list scheduler, on every
    list-scheduled schedule of 1-6 stages and 1-10 micro-batches."""
    from sim.training import schedules

    specs = [schedules._greedy_spec(schedule, pp, m, v)
             for schedule, v in [("zb-h2", 1), ("zb-v", 2), ("v-half", 2), ("v-min", 2), ("hanayo", 2), ("hanayo", 4)]
             for pp in range(1, 7) for m in range(1, 11)]
    expected = [_list_schedule_one_by_one(spec) for spec in specs]
    for spec, ops in zip(specs, expected):
        assert np.array_equal(schedules._greedy([spec])[0], ops), spec
    for split in (True, False):
        group = [s for s in specs if s.split == split]
        together = schedules._greedy(group)
        assert all(np.array_equal(a, expected[specs.index(s)]) for a, s in zip(together, group))


def test_longest_paths_level_by_level_equal_the_op_by_op_longest_paths() -> None:
    """``ProgramGraph.longest_paths`` (levels as contiguous ranges) against the longest paths taken
    op by op in the levels' order, with random prices (the same float operations: equal exactly)."""
    from sim.training import schedules

    rng = np.random.default_rng(7)
    for key in [("zb-v", 4, 8, 2), ("hanayo", 3, 6, 4), ("interleaved", 4, 8, 2), ("zb-h1", 5, 7, 1), ("bfs", 3, 5, 3)]:
        graph = schedules._program_graph_alone(*key)
        price = rng.uniform(0.5, 2.0, size=(int(graph.slot.max()) + 1, 3))
        n = len(graph.slot)
        end = np.zeros((n + 1, 3))
        for ops in graph.levels:
            for op in ops.tolist():
                end[op] = np.maximum(end[graph.prev[op]], end[graph.dep[op]]) + price[graph.slot[op]]
        start, finish = graph.longest_paths(price)
        assert np.array_equal(start, end[graph.first_dep]) and np.array_equal(finish, end[graph.last]), key


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved"])
def test_closed_form_programs_equal_their_stage_by_stage_definition(schedule: str) -> None:
    """The 1F1B-shaped programs, built for all stages in one array operation, against their
    definition written out op by op per stage: ``warmup`` forwards, then for k = 0..n-1 the next
    forward (while any is left), backward k and its W (the first ``deferred`` W at the end)."""
    from sim.training import schedules

    codes = {"F": schedules.F_CODE, "B": schedules.B_CODE, "W": schedules.W_CODE}
    for pp in range(1, 7):
        for m in range(1, 11):
            for v in ((1, 2, 3) if schedule == "interleaved" else (1,)):
                if v > 1 and m % pp:
                    continue
                total = m * v
                forward = [((k // (pp * v)) * pp + k % pp, (k % (pp * v)) // pp) for k in range(total)]
                backward = [(mb, v - 1 - c) for mb, c in forward]
                expected = []
                for stage in range(pp):
                    if schedule == "interleaved" and v > 1:
                        warmup = total if m == pp else min(2 * (pp - stage - 1) + (v - 1) * pp, total)
                    else:
                        warmup = min(pp - stage - 1, m)
                    deferred = min(stage, m) if schedule == "zb-h1" else 0
                    ops = [("F", *forward[i]) for i in range(warmup)]
                    for k in range(total):
                        if warmup + k < total:
                            ops.append(("F", *forward[warmup + k]))
                        ops.append(("B", *backward[k]))
                        if k >= deferred:
                            ops.append(("W", *backward[k]))
                    ops += [("W", *backward[k]) for k in range(deferred)]
                    expected.append([(codes[kind], mb, c) for kind, mb, c in ops])
                program = schedules.schedule_program(schedule, pp, m, v)
                assert np.array_equal(program.ops, np.array(expected)), (pp, m, v)


def test_pareto_of_many_lanes_equals_the_pareto_of_each() -> None:
    """``_pareto_lanes`` (whole-array dominance) against ``_pareto`` lane by lane on random counts,
    with repeated rows, ties of sums and dominated rows."""
    from sim.training import schedules

    rng = np.random.default_rng(0)
    for _ in range(200):
        high = int(rng.choice([2, 4, 10, 1000]))
        counts = rng.integers(0, high, size=(int(rng.integers(1, 12)), int(rng.integers(1, 26)), 3))
        assert schedules._pareto_lanes(counts) == [schedules._pareto(tuple(map(tuple, lane))) for lane in counts.tolist()]


def test_list_scheduler_names_the_program_that_cannot_proceed() -> None:
    from sim.training import schedules

    stuck = schedules.GreedySpec(pp=2, m=3, place=(0, 1), limits=(0, 1), split=True)  # stage 0 may hold none
    with pytest.raises(InvalidPlanError, match=r"activation limits \[0, 1\] \(pp = 2, m = 3\)"):
        schedules._greedy([schedules._greedy_spec("zb-h2", 2, 3, 1), stuck])


def test_named_programs_never_deadlock() -> None:
    """Every named schedule's program that builds (ops checked, ``build_programs``) runs: executing
    it never deadlocks, on 1-8 stages, 1-12 and 16 micro-batches and its chunk counts. What lets the
    plan search bound a plan's memory from the built program before executing it
    (``check_program``), with the prune rules in their order."""
    from sim.training import schedules

    built = 0
    for schedule in schedules.SCHEDULES:
        chunk_counts = {"interleaved": (1, 2, 3, 4), "bfs": (1, 2, 3), "hanayo": (2, 4, 6)}.get(
            schedule, (2,) if schedule in schedules.V_SHAPES else (1,))
        for pp in range(1, 9):
            for m in list(range(1, 13)) + [16]:
                for v in chunk_counts:
                    try:
                        program = schedules._built_program(schedule, pp, m, v)
                    except InvalidPlanError:
                        continue
                    schedules._execute_all([program])  # raises InvalidPlanError on a deadlock
                    built += 1
    assert built > 900


def test_built_programs_hold_what_their_profiles_say() -> None:
    """``program_occupancy`` of a built, not yet executed program equals its executed profile's
    fields, and ``check_program`` raises for an invalid program as ``program_profile`` does."""
    from sim.training import schedules

    keys = [("zb-v", 4, 8, 2), ("hanayo", 3, 6, 4), ("interleaved", 4, 8, 2), ("gpipe", 3, 5, 1), ("interleaved", 3, 4, 2)]
    schedules._PROFILES.clear()
    schedules.build_programs(keys)
    assert ("interleaved", 3, 4, 2) not in schedules._BUILT
    built = {key: schedules.program_occupancy(*key) for key in keys[:-1]}
    assert not set(keys) & set(schedules._PROFILES)  # nothing executed yet
    for key, occupancy in built.items():
        schedules.check_program(*key)
        profile = schedules.program_profile(*key)
        assert (occupancy.peak_held_chunks, occupancy.last_chunk_inflight) == (profile.peak_held_chunks, profile.last_chunk_inflight)
        assert [occupancy.inflight_stages(s) for s in range(key[1])] == [profile.inflight_stages(s) for s in range(key[1])]
    with pytest.raises(InvalidPlanError, match="multiple of pp|divisible by pp"):
        schedules.check_program("interleaved", 3, 4, 2)
