"""How an MoE layer is priced and held, on Megatron-Bridge's Qwen3 30B-A3B run of published-training.md
A10 (16 H100, fp8 current scaling, TP 1, PP 2 x 24 virtual stages, EP 8): per-expert GEMM kernels
(``moe_expert_gemm``), where the router probabilities scale (``moe_prob_scaling``), the dispatcher's
token permutations, the per-op table's layer kinds, and experts folded apart from the attention
(``parallel.etp``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hardware.units import GiB
from sim.costmodel import op_time_s
from sim.runner import RunOptions, simulate
from sim.training.activations import ROUTER_PROB_BYTES, layer_activation_parts
from sim.training.config import parse_training
from sim.training.costs import ep_overlap_unpaired_share, group_links, layer_kind_ops, price_layer
from workloads.errors import InvalidPlanError
from workloads.graph import EXPERT_GEMMS

REPO = Path(__file__).resolve().parents[2]
QWEN3_A10 = {
    "model": {"name": "qwen3-30b-a3b"},
    "cluster": {"gpu": "h100-sxm-80gb", "node": "dgx-h100", "network": "ib-ndr-fat-tree", "num_gpus": 16},
    "training": {"seq_len": 4096, "global_batch": 512, "micro_batch": 2, "precision": "fp8",
                 "framework": "megatron-bridge"},
    "parallel": {"tp": 1, "pp": 2, "ep": 8, "zero": 1, "schedule": "interleaved", "virtual_stages": 24},
}
MOE_LAYER = (True, False, False)  # layer_kind_ops key: an MoE layer, not fully recomputed, fp8 GEMMs


def _with(section: str, **values: object) -> dict:
    return {**QWEN3_A10, section: {**QWEN3_A10[section], **values}}


def _metrics(config: dict) -> dict:
    return simulate(config, RunOptions(fidelity="analytic")).metrics()


@pytest.mark.parametrize(("framework", "gemm", "probs"), [
    ("megatron-bridge", "per_expert", "activation"), ("megatron-core", "per_expert", "hidden"),
    ("nemo", "per_expert", "hidden"), ("torchtitan", "grouped", "hidden"), ("llm-foundry", "grouped", "hidden"),
])
def test_each_stack_sets_its_expert_gemms_and_probability_scaling(framework: str, gemm: str, probs: str) -> None:
    setup = parse_training(_with("training", framework=framework))
    assert (setup.moe_expert_gemm, setup.moe_prob_scaling) == (gemm, probs)


def test_per_expert_gemms_cost_one_kernel_per_expert_at_its_own_shape() -> None:
    per_expert = parse_training(QWEN3_A10)
    grouped = parse_training(_with("training", moe_expert_gemm="grouped"))
    links: dict = {}
    for setup, kernels in ((per_expert, 16), (grouped, 1)):
        forward, b_ops, w_ops = layer_kind_ops(setup, MOE_LAYER)
        experts = [op for op in forward + b_ops + w_ops if op.name.startswith(EXPERT_GEMMS) and op.kind == "gemm"]
        assert len(experts) == 6  # up and down: forward, dgrad, wgrad
        for op in experts:
            assert op.batch == 16 and op.kernels == kernels, op.name  # 128 experts over EP 8, all active
            if kernels > 1:  # each kernel one expert's GEMM at its own shape
                single = op_time_s(dataclasses.replace(op, batch=1, kernels=1), setup.cluster.gpu, precision="fp8", links=links)
                assert op_time_s(op, setup.cluster.gpu, precision="fp8", links=links) == pytest.approx(16 * single, rel=1e-12)
    # 4,096 tokens per expert: the H100's measured fp8 rate at one expert's shape (m 4,096, n 1,536,
    # k 2,048) is below the roofline of one 65,536-row batch, so the step is slower per expert
    slow, fast = _metrics(QWEN3_A10), _metrics(_with("training", moe_expert_gemm="grouped"))
    assert slow["iteration_time_s"] > 1.05 * fast["iteration_time_s"]


def test_probabilities_scaled_inside_the_activation_keep_no_hidden_wide_tensor() -> None:
    # per routed token: the fp8 expert input (1 B x h), the SwiGLU input (2 x 2 B x f) and its fp8
    # output (1 B x f), and either the 16-bit expert output (2 B x h) or the fp32 probability (4 B)
    setup = parse_training(QWEN3_A10)
    hidden = dataclasses.replace(setup.job, moe_prob_scaling="hidden")
    tokens, k, h = 2 * 4096, 8, 2048
    parts = {job.moe_prob_scaling: layer_activation_parts(setup.model, setup.plan, job, moe=True,
                                                          flash_attention=True, dropout=False)
             for job in (setup.job, hidden)}
    saved = parts["hidden"].full_bytes - parts["activation"].full_bytes
    assert saved == pytest.approx(k * tokens * (2.0 * h - ROUTER_PROB_BYTES), rel=1e-12)
    dense = layer_activation_parts(setup.model, setup.plan, setup.job, moe=False, flash_attention=True, dropout=False)
    routed = k * tokens * (1.0 * h + ROUTER_PROB_BYTES + (2 * 2.0 + 1.0) * 768)
    router = ROUTER_PROB_BYTES * tokens * 128
    mlp = tokens * (2 * 2.0 + 1.0) * 6144  # the dense MLP the MoE layer replaces
    assert parts["activation"].full_bytes - dense.full_bytes == pytest.approx(routed + router - mlp, rel=1e-12)
    with pytest.raises(InvalidPlanError, match="moe_prob_scaling"):
        dataclasses.replace(setup.job, moe_prob_scaling="output")


def test_the_published_qwen3_moe_run_is_predicted_to_fit() -> None:
    # Megatron-Bridge ran it on 80 GB H100s (performance-summary.md at 00b7660b, 5,275 tokens/s per GPU).
    # Counting each routed token's expert input in 16 bits and its 16-bit expert output, the model had
    # read 82.7 GiB; the fp8 input and the probabilities scaled inside the activation leave 65 GiB
    fits = _metrics(QWEN3_A10)
    assert fits["fits_in_memory"] and fits["peak_memory_bytes"] < 66 * GiB
    # the expert output alone, 2 B x h per routed token, over the ~47 one-layer chunks in flight
    hidden = _metrics(_with("training", moe_prob_scaling="hidden"))
    assert hidden["peak_memory_bytes"] - fits["peak_memory_bytes"] > 11 * GiB


# Megatron-Bridge 26.04's H100 Qwen3 30B-A3B config (74695a06d): EP 16 over two nodes, the flex dispatcher
QWEN3_EP16 = {**QWEN3_A10, "training": {**QWEN3_A10["training"], "global_batch": 1024, "micro_batch": 1},
              "parallel": {"tp": 1, "pp": 1, "ep": 16, "zero": 1}}


def test_the_flex_dispatcher_sends_each_token_once_per_node_and_rank() -> None:
    alltoall = parse_training(QWEN3_EP16)
    flex = parse_training({**QWEN3_EP16, "training": {**QWEN3_EP16["training"], "moe_dispatcher": "flex"}})
    assert (alltoall.moe_dispatcher, flex.moe_dispatcher) == ("alltoall", "flex")
    (a2a_ops, _, _), (flex_ops, flex_b, _) = layer_kind_ops(alltoall, MOE_LAYER), layer_kind_ops(flex, MOE_LAYER)
    a2a = {op.name: op for op in a2a_ops if op.axis == "ep"}
    dispatch = {op.name: op for op in flex_ops + flex_b if op.axis == "ep"}
    assert sorted(dispatch) == ["ep_combine", "ep_combine_backward", "ep_dispatch", "ep_dispatch_backward"]
    for name, op in dispatch.items():
        assert op.collective == "token_dispatch" and (op.routed_experts, op.experts_per_token) == (128, 8)
        assert op.message_bytes == pytest.approx(a2a[name.removesuffix("_backward")].message_bytes / 8, rel=1e-12)
    # both fidelities price the same ops: the 2-node dispatch moves a quarter of the inter-node bytes
    results = {(d, f): simulate(c, RunOptions(fidelity=f)).metrics() for d, c in (("a2a", QWEN3_EP16), ("flex", {
        **QWEN3_EP16, "training": {**QWEN3_EP16["training"], "moe_dispatcher": "flex"}})) for f in ("analytic", "des")}
    for fidelity in ("analytic", "des"):
        ep_a2a = results["a2a", fidelity]["exposed_communication_s"]["ep"]
        ep_flex = results["flex", fidelity]["exposed_communication_s"]["ep"]
        assert ep_flex < 0.4 * ep_a2a
    for dispatcher in ("a2a", "flex"):
        des, analytic = results[dispatcher, "des"]["iteration_time_s"], results[dispatcher, "analytic"]["iteration_time_s"]
        assert analytic == pytest.approx(des, rel=0.02)


@pytest.mark.parametrize(("key", "value"), [("moe_expert_gemm", "cutlass"), ("moe_prob_scaling", "input"),
                                            ("moe_dispatcher", "deepep")])
def test_a_bad_moe_setting_is_one_line_exit_2(tmp_path: Path, key: str, value: str) -> None:
    config = tmp_path / "moe.toml"
    config.write_text(
        '[model]\nname = "qwen3-30b-a3b"\n[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 16\n'
        f'[training]\nseq_len = 4096\nglobal_batch = 512\nmicro_batch = 2\n{key} = "{value}"\n'
        '[parallel]\npp = 2\nep = 8\n'
    )
    run = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config)], cwd=REPO, capture_output=True,
                         text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and key in lines[0] and value in lines[0]


def test_token_permutations_move_each_routed_row_in_and_out() -> None:
    # 8,192 tokens x 8 experts each, h 2,048, 16-bit rows: the permute into expert order and the sort
    # of arriving chunks by local expert read and write k T h a each, the unpermute reads the k copies
    # and writes one sum; backward runs the inverse permutations over the same bytes
    tokens, k, h, a = 2 * 4096, 8, 2048, 2.0
    rows = k * tokens * h * a
    forward, b_ops, _ = layer_kind_ops(parse_training(QWEN3_A10), MOE_LAYER)
    moved = {op.name: op.bytes_moved for op in forward + b_ops if "permute" in op.name or "sort_chunks" in op.name}
    assert moved == {
        "moe_permute": 2 * rows, "moe_sort_chunks": 2 * rows, "moe_unsort_chunks": 2 * rows,
        "moe_unpermute": rows + rows / k,
        "moe_permute_backward": 2 * rows, "moe_sort_chunks_backward": 2 * rows,
        "moe_unsort_chunks_backward": 2 * rows, "moe_unpermute_backward": rows + rows / k,
    }
    names = [op.name for op in forward]
    assert names.index("moe_permute") < names.index("ep_dispatch") < names.index("moe_sort_chunks") \
        < names.index("experts_up") < names.index("moe_unsort_chunks") < names.index("ep_combine") \
        < names.index("moe_unpermute")
    # one local expert (Mixtral's 8 over EP 8): arriving tokens are already grouped, nothing to sort
    mixtral = parse_training({**QWEN3_A10, "model": {"name": "mixtral-8x7b"}, "parallel": {"pp": 2, "ep": 8},
                              "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1}})
    forward, _, _ = layer_kind_ops(mixtral, MOE_LAYER)
    assert [op.name for op in forward if "permute" in op.name or "sort" in op.name] == ["moe_permute", "moe_unpermute"]


def test_the_per_op_table_lists_only_the_layer_kinds_the_model_has() -> None:
    # every Qwen3 30B-A3B layer is MoE: no dense layer in `-v` or ops.csv; DeepSeek-V3's first three
    # layers are dense, so both kinds
    frame = simulate(QWEN3_A10, RunOptions(fidelity="analytic")).op_frame()
    assert set(frame["layer_kind"]) == {"moe"}
    deepseek = {**QWEN3_A10, "model": {"name": "deepseek-v3"}, "cluster": {**QWEN3_A10["cluster"], "num_gpus": 1024},
                "training": {**QWEN3_A10["training"], "micro_batch": 1, "global_batch": 64, "precision": "bf16"},
                "parallel": {"tp": 8, "pp": 8, "ep": 8, "zero": 1}}
    assert set(simulate(deepseek, RunOptions(fidelity="analytic")).op_frame()["layer_kind"]) == {"dense", "moe"}


# MoE Parallel Folding (Megatron-Core --expert-tensor-parallel-size): Qwen3 30B-A3B on 16 H100 with the
# attention at TP 2 x DP 8 and the experts at ETP 1 x EP 16, so an expert group spans both nodes
FOLDED = {
    "model": {"name": "qwen3-30b-a3b"},
    "cluster": {"gpu": "h100-sxm-80gb", "node": "dgx-h100", "network": "ib-ndr-fat-tree", "num_gpus": 16},
    "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "framework": "megatron-bridge"},
    "parallel": {"tp": 2, "ep": 16, "etp": 1, "sequence_parallel": True, "zero": 1},
}


def test_folded_experts_split_their_ranks_apart_from_the_attention() -> None:
    from sim.training.costs import stage_groups
    from sim.training.memory import memory_per_stage

    setup = parse_training(FOLDED)
    assert (setup.plan.expert_tp, setup.plan.expert_dp) == (1, 1)
    assert stage_groups(setup, 0)["ep"] == (0, 1, 16)  # every rank of the stage, both nodes
    forward, _, _ = layer_kind_ops(setup, MOE_LAYER)
    up = next(op for op in forward if op.name == "experts_up")
    # each TP rank routes its 2,048-token sequence shard x 8 experts; 8 local experts of the 128 take
    # 16 ranks' pairs: 2,048 x 8 x 16 x 8 / 128 = 16,384 rows, 2,048 per expert, at the full width 768
    assert (up.m, up.n, up.k, up.batch) == (2048, 2 * 768, 2048, 8)
    dispatch = next(op for op in forward if op.name == "ep_dispatch")
    assert dispatch.message_bytes == 2048 * 8 * 2048 * 2.0
    # the experts' parameters: 128 x 3 x 2,048 x 768 per layer over ep x etp = 16 ranks, none replicated
    (stage,) = memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=80 * GiB)
    unfolded = dataclasses.replace(setup.plan, ep=8, etp=0)  # experts split like the attention: TP 2 x EP 8
    (plain,) = memory_per_stage(setup.model, unfolded, setup.job, capacity_bytes=80 * GiB)
    assert stage.weights_bytes == pytest.approx(plain.weights_bytes, rel=1e-12)  # 16 ranks share the experts either way


def test_etp_equal_to_tp_is_the_unfolded_plan() -> None:
    base = _metrics(QWEN3_A10)
    explicit = _metrics(_with("parallel", etp=1))  # tp = 1
    assert explicit == base


@pytest.mark.parametrize(("parallel", "words"), [
    ({"tp": 2, "ep": 16, "etp": 1}, "needs sequence_parallel"),
    ({"tp": 2, "ep": 32, "etp": 1, "sequence_parallel": True}, "must divide tp \\* cp \\* dp = 16"),
    ({"tp": 2, "ep": 16, "etp": 5, "sequence_parallel": True}, "ep x etp = 16 x 5 must divide"),
    ({"tp": 2, "ep": 16, "etp": -1, "sequence_parallel": True}, "positive integer"),
])
def test_bad_expert_folding_names_the_rule(parallel: dict, words: str) -> None:
    with pytest.raises(InvalidPlanError, match=words):
        parse_training({**FOLDED, "parallel": parallel})


def test_expert_tp_needs_experts_it_can_split() -> None:
    with pytest.raises(InvalidPlanError, match="needs a mixture-of-experts model"):
        parse_training({**FOLDED, "model": {"name": "llama3-8b"}, "parallel": {"tp": 2, "etp": 1, "sequence_parallel": True}})
    odd = {"hidden": 1024, "layers": 4, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
           "experts": 8, "experts_per_token": 2, "expert_ffn_hidden": 1000}
    with pytest.raises(InvalidPlanError, match="must divide the expert width 1000"):
        parse_training({**FOLDED, "model": odd, "parallel": {"tp": 1, "etp": 16}})


def test_folded_experts_from_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "folded.toml"
    config.write_text(
        '[model]\nname = "qwen3-30b-a3b"\n[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 16\n'
        '[training]\nseq_len = 4096\nglobal_batch = 64\nmicro_batch = 1\n'
        '[parallel]\ntp = 2\nep = 16\netp = 1\nsequence_parallel = true\nzero = 1\n'
    )
    run = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--format", "json"], cwd=REPO,
                         capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert run.returncode == 0, run.stderr
    parallel = json.loads(run.stdout)["parallel"]
    assert (parallel["tp"], parallel["ep"], parallel["etp"], parallel["dp"]) == (2, 16, 1, 8)
    table = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config)], cwd=REPO, capture_output=True,
                           text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert "ep 16  etp 1" in table.stdout


def _overlap(config: dict, **parallel: object) -> dict:
    return {**config, "parallel": {**config["parallel"], "ep_comm_overlap": True, **parallel}}


def test_ep_comm_overlap_hides_each_passs_all_to_alls_behind_the_other_passs_compute() -> None:
    # PP 2 x 24 chunks, 512 / (8 x 2) = 32 micro-batches: 2 of 32 passes run alone (pp / m)
    blocking, overlapped = parse_training(QWEN3_A10), parse_training(_overlap(QWEN3_A10))
    alone = 2 / 32
    slowdown = overlapped.overlap_slowdown - 1.0
    assert ep_overlap_unpaired_share(overlapped) == pytest.approx(alone, rel=1e-12)
    links = group_links(blocking, 0)
    base = price_layer(blocking, layer_kind_ops(blocking, MOE_LAYER), links)
    hidden = price_layer(overlapped, layer_kind_ops(overlapped, MOE_LAYER), links)
    f, b, w = base.forward, base.backward_input, base.backward_weight
    assert f.exposed_comm_s["ep"] > 0 and b.exposed_comm_s["ep"] > 0
    for name, own, partner in (("forward", f, b.compute_s + w.compute_s), ("backward_input", b, f.compute_s)):
        covered = (1 - alone) * min(own.exposed_comm_s["ep"], partner)
        expected = own.exposed_comm_s["ep"] - covered * (1 - slowdown)
        assert getattr(hidden, name).exposed_comm_s["ep"] == pytest.approx(expected, rel=1e-12)
        assert getattr(hidden, name).compute_s == own.compute_s
    assert hidden.backward_weight == w
    # end to end, in both fidelities alike
    step = {f: (_metrics_at(QWEN3_A10, f), _metrics_at(_overlap(QWEN3_A10), f)) for f in ("analytic", "des")}
    for before, after in step.values():
        assert after["exposed_communication_s"]["ep"] < 0.3 * before["exposed_communication_s"]["ep"]
        assert after["iteration_time_s"] < before["iteration_time_s"]
    assert step["analytic"][1]["iteration_time_s"] == pytest.approx(step["des"][1]["iteration_time_s"], rel=0.02)


def _metrics_at(config: dict, fidelity: str) -> dict:
    return simulate(config, RunOptions(fidelity=fidelity)).metrics()


def test_ep_comm_overlap_with_as_many_micro_batches_as_stages_hides_nothing() -> None:
    # 32 sequences over dp 8 at micro-batch 2 on pp 2: interleaving needs m >= pp; with m = pp every pass is warm-up
    few = _overlap({**QWEN3_A10, "training": {**QWEN3_A10["training"], "global_batch": 32}})
    blocking = {**few, "parallel": {**few["parallel"], "ep_comm_overlap": False}}
    assert _metrics(few)["iteration_time_s"] == pytest.approx(_metrics(blocking)["iteration_time_s"], rel=1e-12)


@pytest.mark.parametrize(("parallel", "words"), [
    ({"schedule": "1f1b", "virtual_stages": 1}, "needs schedule 'interleaved'"),
    ({"recompute": "full"}, "recompute other than 'full'"),
])
def test_ep_comm_overlap_refuses_what_megatron_refuses(parallel: dict, words: str) -> None:
    with pytest.raises(InvalidPlanError, match=words):
        parse_training(_overlap(QWEN3_A10, **parallel))


def test_the_combined_1f1b_holds_one_more_forward() -> None:
    from sim.training.activations import inflight_microbatches

    interleaved, overlapped = parse_training(QWEN3_A10).plan, parse_training(_overlap(QWEN3_A10)).plan
    for stage in (0, 1):  # one extra chunk-forward of 24 in the warm-up
        assert inflight_microbatches(overlapped, 32, stage) == pytest.approx(
            inflight_microbatches(interleaved, 32, stage) + 1 / 24, rel=1e-12)
    flat = parse_training(QWEN3_EP16).plan
    assert inflight_microbatches(flat, 64, 0) == 1.0
    assert inflight_microbatches(dataclasses.replace(flat, ep_comm_overlap=True), 64, 0) == 2.0
    assert inflight_microbatches(dataclasses.replace(flat, ep_comm_overlap=True), 1, 0) == 1.0
