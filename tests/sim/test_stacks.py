"""Software-stack profiles (sim/stacks/): catalog, selection by `framework`, user overrides, and the
mechanisms the profiles switch (unfused main-grad accumulation, gradient-reduction dtype, the
decode-attention rule), each on a tiny case with its closed form."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sim.errors import ConfigError
from sim.runner import RunOptions
from sim.stacks import DEFAULT_FRAMEWORK, SETTINGS, get_stack, profiles
from sim.training.config import parse_training
from sim.training.costs import layer_passes
from sim.training.data_parallel import grad_sync_work
from sim.training.costs import group_links
from sim.training.run import simulate_training

TRAINING_STACKS = {"megatron-2021", "deepspeed-zero-2021", "megatron-core", "torchtitan", "llm-foundry", "nemo",
                   "nemo-1.17", "nemo-1.20", "megatron-bridge"}
SERVING_STACKS = {"trtllm-0.9", "trtllm", "vllm", "vllm-0.5", "fastertransformer"}


def test_catalog_holds_every_stack_with_every_setting_sourced() -> None:
    assert set(profiles("training")) == TRAINING_STACKS
    assert set(profiles("serving")) == SERVING_STACKS
    for kind in ("training", "serving"):
        assert DEFAULT_FRAMEWORK[kind] in profiles(kind)
        for profile in profiles(kind).values():
            assert set(profile.settings) == set(SETTINGS[kind])
            # a source says where the value comes from: never the bare value again
            assert all(profile.sources[key].strip() and profile.sources[key].strip() != str(value).lower()
                       and len(profile.sources[key].split()) > 1 for key, value in profile.settings.items()), profile.name


def _config(**training) -> dict:
    return {
        "model": {"name": "gpt3-1.7b"},
        "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 2048, "global_batch": 16, "micro_batch": 1, "precision": "fp16", **training},
        "parallel": {"tp": 1, "pp": 1},
    }


def test_framework_selects_the_profile_and_config_keys_override_it() -> None:
    old = parse_training(_config(framework="megatron-2021"))
    assert (old.framework, old.attention_kernel, old.dp_comm_overlap, old.main_grad_accumulation) == (
        "megatron-2021", "unfused", False, "unfused")
    default = parse_training(_config())
    assert default.framework == "megatron-core" and default.attention_kernel == "cudnn" and default.dp_comm_overlap
    mixed = parse_training({**_config(framework="megatron-2021", attention_kernel="flash"),
                            "parallel": {"tp": 1, "pp": 1, "dp_comm_overlap": True}})
    assert mixed.attention_kernel == "flash" and mixed.dp_comm_overlap and mixed.main_grad_accumulation == "unfused"
    with pytest.raises(ConfigError, match="framework = 'megatron-1999'; allowed: "):
        parse_training(_config(framework="megatron-1999"))
    with pytest.raises(ConfigError, match="main_grad_accumulation = 'sometimes'; allowed: fused, unfused, none, flat_param"):
        parse_training(_config(main_grad_accumulation="sometimes"))


def test_unknown_framework_is_a_one_line_error_with_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.toml"
    path.write_text('[model]\nname = "gpt3-1.7b"\n[cluster]\ngpu = "a100-sxm-80gb"\nnum_gpus = 1\n'
                    '[training]\nseq_len = 2048\nglobal_batch = 1\nframework = "jax"\n')
    out = subprocess.run([sys.executable, "-m", "sim", "simulate", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("error: [training] framework = 'jax'; allowed: ") and "Traceback" not in out.stderr


def test_unfused_main_grad_accumulation_adds_one_add_kernel_per_weight_gradient() -> None:
    # 2021 Megatron: after each wgrad GEMM, main_grad.add_(grad) reads the 16-bit gradient and reads and
    # writes the main-grad element (fp16 training reduces in fp16: 2 + 2 x 2 bytes per element)
    setup = parse_training(_config(framework="megatron-2021"))
    _, _, w_ops = layer_passes(setup, moe=False)
    gemms = [op for op in w_ops if op.kind == "gemm"]
    adds = [op for op in w_ops if op.name.endswith("_accumulate")]
    assert len(adds) == len(gemms) == 4
    h = setup.model.hidden
    assert sum(op.bytes_moved for op in adds) == pytest.approx((4 * h * h + 8 * h * h) * (2 + 2 * 2))
    fused = parse_training(_config(framework="megatron-2021", main_grad_accumulation="fused"))
    assert not [op for op in layer_passes(fused, moe=False)[2] if op.name.endswith("_accumulate")]
    slow = simulate_training(_config(framework="megatron-2021"), RunOptions(fidelity="analytic")).metrics()
    fast = simulate_training(_config(framework="megatron-2021", main_grad_accumulation="fused"),
                             RunOptions(fidelity="analytic")).metrics()
    assert slow["iteration_time_s"] > fast["iteration_time_s"]
    assert slow["framework"] == "megatron-2021"


def test_fsdp_flat_parameter_copies_and_predivides_every_gradient() -> None:
    # torch FSDP1 (llm-foundry): split's backward copies each wgrad GEMM's 16-bit gradient into the
    # flat gradient (read 2 + write 2 bytes an element), and FSDP divides the unsharded gradient in
    # place before each reduce-scatter (bf16: read 2 + write 2), then the 1/8 shard (post-divide 2 + 2,
    # cast to the fp32 parameter 2 + 4)
    from sim.training.data_parallel import flat_gradient_prepare_bytes

    config = _config(precision="bf16", framework="llm-foundry")
    config["parallel"] = {"tp": 1, "pp": 1, "zero": 3}
    setup = parse_training(config)
    assert (setup.main_grad_accumulation, setup.grad_reduce_dtype) == ("flat_param", "bf16")
    _, _, w_ops = layer_passes(setup, moe=False)
    copies = [op for op in w_ops if op.name.endswith("_flat_grad_copy")]
    assert len(copies) == len([op for op in w_ops if op.kind == "gemm"]) == 4
    h = setup.model.hidden
    assert sum(op.bytes_moved for op in copies) == pytest.approx(12 * h * h * (2 + 2))
    assert flat_gradient_prepare_bytes(setup, 8) == pytest.approx(2 * 2 + (2 * 2 + 2 + 4) / 8)
    assert flat_gradient_prepare_bytes(setup, 1) == 0.0
    fp32 = parse_training({**config, "training": {**config["training"], "grad_reduce_dtype": "fp32"}})
    assert flat_gradient_prepare_bytes(fp32, 8) == pytest.approx((2 + 4) + 2 * 4 + 2 * 4 / 8)  # cast first
    none = parse_training({**config, "training": {**config["training"], "main_grad_accumulation": "none"}})
    assert flat_gradient_prepare_bytes(none, 8) == 0.0
    assert not [op for op in layer_passes(none, moe=False)[2] if op.kind == "memory"]
    # the predivide runs on the data-parallel stream before each bucket's reduce-scatter
    flat = grad_sync_work(setup, 0, group_links(setup, 0))
    plain = grad_sync_work(none, 0, group_links(none, 0))
    assert [w.message_bytes for w in flat] == [w.message_bytes for w in plain]
    assert all(f.duration_s > p.duration_s for f, p in zip(flat, plain))
    slow = simulate_training(config, RunOptions(fidelity="des")).metrics()["iteration_time_s"]
    fast = simulate_training({**config, "training": {**config["training"], "main_grad_accumulation": "none"}},
                             RunOptions(fidelity="des")).metrics()["iteration_time_s"]
    assert slow > fast


def test_grad_reduce_dtype_sets_the_bucket_bytes() -> None:
    def buckets(**training):  # type: ignore[no-untyped-def]
        setup = parse_training({**_config(precision="bf16", **training)})
        return sum(w.message_bytes for w in grad_sync_work(setup, 0, group_links(setup, 0)))

    fp32 = buckets()
    assert buckets(grad_reduce_dtype="bf16") == pytest.approx(fp32 / 2)  # Megatron --grad-reduce-in-bf16
    assert buckets(grad_reduce_dtype="fp32") == fp32
    with pytest.raises(ConfigError, match="grad_reduce_dtype = 'bf16' with precision 'fp16'"):
        parse_training(_config(grad_reduce_dtype="bf16"))
    # a stack's bf16 reduction with fp16 names the framework, not a key the user did not write
    with pytest.raises(ConfigError, match="framework = 'nemo-1.17' \\(its grad_reduce_dtype is 'bf16'"):
        parse_training(_config(framework="nemo-1.17"))
    # Megatron-Bridge reduces in the parameters' 16-bit dtype (grad_reduce_in_fp32 = False): fp16 runs
    assert parse_training(_config(framework="megatron-bridge")).grad_reduce_dtype == "fp16"


def test_tp_comm_overlap_with_tp_1_is_accepted() -> None:
    config = _config()
    config["parallel"] = {"tp": 1, "pp": 1, "tp_comm_overlap": True}
    parse_training(config)  # nothing to overlap, not an error


def test_inline_model_needs_no_name_nor_max_seq_len() -> None:
    config = _config()
    config["model"] = {"hidden": 2048, "layers": 4, "heads": 16, "kv_heads": 16, "ffn_hidden": 8192, "vocab": 32000,
                       "activation": "gelu"}
    setup = parse_training(config)
    assert setup.model.name == "custom" and setup.model.max_seq_len == 2048


def test_serving_framework_sets_overheads_and_decode_attention() -> None:
    from sim.serving.config import parse_serving
    from sim.serving.stepcost import decode_attention_kernel
    from workloads.catalog import get_model

    default = parse_serving({})
    assert default.framework == "vllm" and default.step_overhead_s == pytest.approx(126e-6)
    trt = parse_serving({"framework": "trtllm-0.9"})
    assert trt.step_overhead_s == 0.0 and trt.decode_attention == "xqa"
    assert parse_serving({"framework": "trtllm-0.9", "step_overhead_us": 50.0}).step_overhead_s == pytest.approx(50e-6)
    assert decode_attention_kernel("xqa", get_model("llama2-70b"), 8) == "shared_kv"
    assert decode_attention_kernel("xqa", get_model("mistral-7b"), 1) == "per_query_head"
    assert get_stack("serving", "fastertransformer").settings["decode_attention"] == "per_query_head"


def test_serving_framework_sets_the_kv_block_size(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # TensorRT-LLM's paged KV cache counts 64-token blocks, vLLM 16; a key the user gives wins
    from sim.serving.config import parse_serving
    from tests.test_cli_bad_input import serving_error

    assert parse_serving({}).block_size == 16
    assert parse_serving({"framework": "trtllm"}).block_size == 64
    assert parse_serving({"framework": "trtllm", "block_size": 32}).block_size == 32
    err = serving_error(capsys, tmp_path, 'framework = "trtllm"\nblock_size = 0')
    assert err == "error: [serving] block_size = 0 must be an integer >= 1"


def _fp8(**training) -> dict:
    return {
        "model": {"name": "llama2-7b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 4096, "global_batch": 128, "micro_batch": 1, "precision": "fp8", **training},
        "parallel": {},
    }


def test_fp8_cast_kernels_follow_transformer_engine_fusion() -> None:
    m, h, f = 4096, 4096, 11008

    def casts(**training) -> tuple[dict[str, float], dict[str, float]]:
        forward, backward, weight = layer_passes(parse_training(_fp8(**training)), moe=False)
        return ({op.name: op.bytes_moved for op in forward + backward if op.name.endswith("_fp8_cast")},
                {op.name: op.bytes_moved for op in weight if op.name.endswith("_fp8_transpose")})

    # Megatron-Core (the default stack), delayed scaling: the norms write fp8 (no cast kernel; the
    # transpose for the weight gradient in backward, read 1 + write 1); the MLP activation is
    # Megatron's own kernel, so fc2's input and fc1's output gradient get cast-transpose kernels (read
    # 2, write 1 + 1), as do out_proj's input and the output gradients of qkv, out_proj and mlp_down
    cast, transpose = casts()
    assert cast == {"out_proj_fp8_cast": 4 * m * h, "mlp_down_fp8_cast": 4 * m * f,
                    "mlp_down_dgrad_fp8_cast": 4 * m * h, "mlp_up_dgrad_fp8_cast": 4 * m * 2 * f,
                    "out_proj_dgrad_fp8_cast": 4 * m * h, "qkv_proj_dgrad_fp8_cast": 4 * m * 3 * h}
    assert transpose == {"qkv_proj_fp8_transpose": 2 * m * h, "mlp_up_fp8_transpose": 2 * m * h}
    # Transformer Engine's LayerNormMLP also fuses the activation's cast, forward and backward
    cast, transpose = casts(fp8_cast_fusion="norm_activation")
    assert cast == {"out_proj_fp8_cast": 4 * m * h, "mlp_down_dgrad_fp8_cast": 4 * m * h,
                    "out_proj_dgrad_fp8_cast": 4 * m * h, "qkv_proj_dgrad_fp8_cast": 4 * m * 3 * h}
    assert transpose["mlp_down_fp8_transpose"] == 2 * m * f and len(transpose) == 3
    # current scaling: an amax pass (read 2) before every cast but a fusing norm's (it takes the
    # amax itself); no transposes (every cast writes fp8 and fp8^T)
    cast, transpose = casts(fp8_recipe="current")
    assert cast["mlp_up_fp8_cast"] == 4 * m * h and cast["mlp_down_fp8_cast"] == 6 * m * f
    assert cast["mlp_up_dgrad_fp8_cast"] == 6 * m * 2 * f and len(cast) == 8 and not transpose
    cast, _ = casts(fp8_recipe="current", fp8_cast_fusion="none")
    assert cast["mlp_up_fp8_cast"] == 6 * m * h and cast["qkv_proj_fp8_cast"] == 6 * m * h
    # a fused activation takes the amax too (TE activation.cpp FUSED_ACTIVATION_AMAX_FP8)
    cast, _ = casts(fp8_recipe="current", fp8_cast_fusion="norm_activation")
    assert cast["mlp_down_fp8_cast"] == 4 * m * f and cast["mlp_up_dgrad_fp8_cast"] == 4 * m * 2 * f
    # the LM head stays 16-bit
    from sim.training.costs import end_ops

    ((head, _, _),) = end_ops(parse_training(_fp8()), first=False, last=True)
    assert [op.precision for op in head if op.kind == "gemm"] == ["bf16"]


def test_fp8_casts_before_a_sequence_parallel_gather_run_on_the_shard() -> None:
    # TP 8 with sequence parallelism, gathers in fp8: a gathered GEMM input (qkv and fc1 in forward,
    # the out_proj and fc2 output gradients in backward) is cast on its 1/8 sequence shard, one
    # layout (read 2, write 1), and its transpose for the weight gradient is made from the gathered
    # fp8 tensor (read 1, write 1 over all rows); GEMM inputs that are not gathered keep their
    # cast-transpose over their own rows
    m, h, f, tp = 4096, 4096, 11008, 8

    def casts(**training) -> tuple[dict[str, float], dict[str, float]]:
        config = _fp8(**training)
        config["parallel"] = {"tp": tp, "sequence_parallel": True}
        forward, backward, weight = layer_passes(parse_training(config), moe=False)
        return ({op.name: op.bytes_moved for op in forward + backward if op.name.endswith("_fp8_cast")},
                {op.name: op.bytes_moved for op in weight if op.name.endswith("_fp8_transpose")})

    # Megatron-Core, delayed scaling: the norms write fp8 on the shard (no cast kernel)
    cast, transpose = casts()
    assert cast == {"out_proj_fp8_cast": 4 * m * h / tp, "mlp_down_fp8_cast": 4 * m * f / tp,
                    "mlp_down_dgrad_fp8_cast": 3 * m * h / tp, "mlp_up_dgrad_fp8_cast": 4 * m * 2 * f / tp,
                    "out_proj_dgrad_fp8_cast": 3 * m * h / tp, "qkv_proj_dgrad_fp8_cast": 4 * m * 3 * h / tp}
    assert transpose == {"qkv_proj_fp8_transpose": 2 * m * h, "mlp_up_fp8_transpose": 2 * m * h,
                         "mlp_down_dgrad_fp8_transpose": 2 * m * h, "out_proj_dgrad_fp8_transpose": 2 * m * h}
    # torchao-style current scaling, no fusion: the shard's cast has its amax pass (read 2)
    cast, transpose = casts(fp8_recipe="current", fp8_cast_fusion="none")
    assert cast["qkv_proj_fp8_cast"] == 5 * m * h / tp and cast["mlp_down_dgrad_fp8_cast"] == 5 * m * h / tp
    assert cast["mlp_down_fp8_cast"] == 6 * m * f / tp and len(transpose) == 4
    # gathers in 16 bits: the gathered tensor is cast, as without sequence parallelism
    cast, transpose = casts(fp8_all_gather=False)
    assert cast["out_proj_dgrad_fp8_cast"] == 4 * m * h and "out_proj_dgrad_fp8_transpose" not in transpose


def test_per_module_fp8_scale_updates_are_small_kernels_each_pass() -> None:
    # TE of 2023 (nemo-1.17 / nemo-1.20): 5 kernels per fp8 module in forward and in backward; TE's
    # LayerNormMLP is one module for fc1 and fc2 (qkv, out_proj, MLP: 3 modules); TE 1.x: none
    from hardware import cost
    from sim.training.costs import FP8_SCALE_UPDATE_BYTES, FP8_SCALE_UPDATE_KERNELS

    setup = parse_training(_fp8(framework="nemo-1.20"))
    forward, backward, _ = layer_passes(setup, moe=False)
    updates = [op for op in forward + backward if "_fp8_scale_update_" in op.name]
    assert FP8_SCALE_UPDATE_KERNELS == 5 and len(updates) == 2 * 3 * 5
    assert {op.name.split("_fp8_scale_update_")[0] for op in updates} == {"qkv_proj", "out_proj", "mlp_up"}
    kernel_s = cost.memory_op_time_s(setup.cluster.gpu, FP8_SCALE_UPDATE_BYTES)
    assert 5e-6 < kernel_s < 6e-6  # launch (4 us) + fill (1.6 us): the small kernel's floor
    separate = layer_passes(parse_training(_fp8(framework="nemo-1.20", fp8_cast_fusion="norm")), moe=False)
    assert sum("_fp8_scale_update_" in op.name for op in separate[0]) == 4 * 5  # fc1 and fc2 apart
    for config in (_fp8(framework="nemo"), _fp8(framework="nemo-1.20", fp8_recipe="current"), _fp8()):
        f, b, _ = layer_passes(parse_training(config), moe=False)
        assert not any("_fp8_scale_update_" in op.name for op in f + b)


def test_cross_entropy_implementations_move_their_bytes_per_logit() -> None:
    # Megatron's unfused fp32 path 38 + 14, Megatron-Core's torch.compile'd fusion 22 + 10,
    # Transformer Engine's Triton kernel 6 + 4 bytes per logit (workloads.graph CROSS_ENTROPY_BYTES)
    from sim.training.costs import end_ops

    logits = 4096 * 32000
    for name, (forward, backward) in {"unfused": (38, 14), "native": (22, 10), "te": (6, 4)}.items():
        setup = parse_training(_fp8(cross_entropy=name))
        ((head, head_b, _),) = end_ops(setup, first=False, last=True)
        (loss,) = [op for op in head if op.name == "cross_entropy"]
        (loss_b,) = [op for op in head_b if op.name == "cross_entropy_backward"]
        assert (loss.bytes_moved, loss_b.bytes_moved) == (forward * logits, backward * logits)
    assert parse_training(_fp8(framework="megatron-bridge")).cross_entropy == "te"
    assert parse_training(_fp8(framework="nemo")).cross_entropy == "unfused"
    with pytest.raises(ConfigError, match="cross_entropy = 'fused'; allowed: unfused, native, te"):
        parse_training(_fp8(cross_entropy="fused"))


def test_fp8_backward_gemms_run_with_the_split_accumulator() -> None:
    # Transformer Engine: _2X_ACC_DGRAD = _2X_ACC_WGRAD = True, fprop fast; every training profile "split"
    forward, backward, weight = layer_passes(parse_training(_fp8()), moe=False)
    gemms = [op for op in forward + backward + weight if op.kind == "gemm"]
    split = {op.name for op in gemms if op.split_accumulator}
    fp8_backward = {op.name for op in gemms if not op.precision and op.name.endswith(("_dgrad", "_wgrad"))}
    assert split == fp8_backward and len(split) == 8  # qkv, out_proj, mlp_up, mlp_down: dgrad + wgrad
    assert not any(op.split_accumulator for op in forward)
    # attention products stay 16-bit and keep the flag off
    assert all(not op.split_accumulator for op in gemms if op.precision == "bf16")
    for config in (_fp8(fp8_backward_accumulation="fast"), _fp8(precision="bf16")):
        f, b, w = layer_passes(parse_training(config), moe=False)
        assert not any(op.split_accumulator for op in f + b + w)
    for name in ("megatron-core", "nemo", "nemo-1.17", "nemo-1.20", "megatron-bridge", "torchtitan", "llm-foundry"):
        assert parse_training(_fp8(framework=name)).fp8_backward_accumulation == "split"
    # the split backward is slower than the same run with fast accumulation everywhere
    slow = simulate_training(_fp8(), RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]
    fast = simulate_training(_fp8(fp8_backward_accumulation="fast"), RunOptions(fidelity="analytic")).metrics()
    assert fast["iteration_time_s"] < slow


def test_fp8_saves_linear_inputs_in_fp8() -> None:
    from sim.training.activations import activation_bytes_per_layer

    bf16, fp8 = parse_training(_fp8(precision="bf16")), parse_training(_fp8())
    saved = activation_bytes_per_layer(bf16.model, bf16.plan, bf16.job) - activation_bytes_per_layer(fp8.model, fp8.plan, fp8.job)
    # QKV, fc1, out-proj and fc2 inputs: one byte less per element
    assert saved == pytest.approx(4096 * (4096 + 4096 + 4096 + 11008))


def test_toml_writer_round_trips_configs() -> None:
    import math
    import tomllib

    from sim.toml_writer import dumps

    config = {"model": {"name": "x", "hidden": 3}, "training": {"seq_len": 2048, "lr": 1.5e-4, "b": True, "l": [1, 2]},
              "serving": {"speculative": {"acceptance_rate": 0.5}, "router": "a \"quoted\" name"}}
    assert tomllib.loads(dumps(config)) == config
    assert math.isinf(tomllib.loads(dumps({"t": {"x": float("inf")}}))["t"]["x"])


def test_kv_cache_memory_rule_of_the_stack() -> None:
    # vLLM: gpu_memory_utilization of the whole GPU, KV gets the rest; TensorRT-LLM: that fraction
    # of what the weights leave free
    from hardware.catalog import get_gpu, get_network, get_node
    from hardware.topology import build_cluster
    from sim.serving.capacity import replica_memory
    from sim.serving.stepcost import ReplicaShape
    from workloads.catalog import get_model

    gpu = get_gpu("h100-sxm-80gb")
    node = get_node(gpu.default_node)
    shape = ReplicaShape(model=get_model("llama3-70b"), cluster=build_cluster(gpu, node, get_network(node.default_network), 2),
                         tp=2, weight_precision="fp16", kv_precision="fp16", activation_precision="fp16")
    args = dict(gpu_memory_utilization=0.9, block_size=16, max_batched_tokens=8192, max_num_seqs=256)
    vllm = replica_memory(shape, **args)
    trt = replica_memory(shape, kv_cache_memory="free_fraction", **args)
    # both out of the memory the CUDA runtime reports (79.11 GiB on an H100 SXM 80GB), not NVML's
    # 81,559 MiB nor the datasheet 80 GiB
    runtime_total = 79.11 * 2**30
    left = runtime_total - vllm.weights_bytes - vllm.workspace_bytes - vllm.comm_bytes
    assert vllm.kv_bytes == pytest.approx(left - 0.1 * runtime_total)
    assert trt.kv_bytes == pytest.approx(0.9 * left)
    # memory the process holds outside its own allocations comes off what either budget leaves KV
    reserve = 791 * 2**20
    assert replica_memory(shape, runtime_reserve_bytes=reserve, **args).kv_bytes == pytest.approx(vllm.kv_bytes - reserve)
    held = replica_memory(shape, kv_cache_memory="free_fraction", runtime_reserve_bytes=reserve, **args)
    assert held.kv_bytes == pytest.approx(0.9 * (left - reserve))
    from sim.serving.config import parse_serving

    assert parse_serving({"framework": "trtllm"}).kv_cache_memory == "free_fraction"
    assert parse_serving({}).kv_cache_memory == "total_fraction"


def _h100_fp8(**training) -> dict:
    return {
        "model": {"name": "llama3-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "precision": "fp8", **training},
        "parallel": {"tp": 1, "pp": 1, "zero": 1},
    }


def _stage0(config: dict):  # type: ignore[no-untyped-def]
    from sim.training.memory import memory_per_stage

    setup = parse_training(config)
    return setup, memory_per_stage(setup.model, setup.plan, setup.job,
                                   capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes)[0]


def test_bf16_gradient_reduction_keeps_2_byte_main_grads() -> None:
    # Megatron-Core DDP: the grad buffer is fp32 only with grad_reduce_in_fp32; main_grad is a view of it
    setup, fp32 = _stage0(_h100_fp8(grad_reduce_dtype="fp32"))
    _, bf16 = _stage0(_h100_fp8(grad_reduce_dtype="bf16"))
    params = setup.model.total_parameters()
    assert fp32.gradients_bytes == pytest.approx(4 * params, rel=1e-6)
    assert bf16.gradients_bytes == pytest.approx(2 * params, rel=1e-6)
    _, fp16 = _stage0({**_config(), "training": {**_config()["training"], "grad_reduce_dtype": "auto"}})
    assert fp16.gradients_bytes == pytest.approx(4 * parse_training(_config()).model.total_parameters(), rel=1e-6)


def test_fp8_primary_weights_drop_the_16_bit_copy_of_matmul_weights() -> None:
    setup, cached = _stage0(_h100_fp8(fp8_params=False))
    _, primary = _stage0(_h100_fp8(fp8_params=True))
    model = setup.model
    matmul = model.layers * (model.attention_parameters() + model.mlp_parameters(model.ffn_hidden))
    assert cached.weights_bytes - primary.weights_bytes == pytest.approx(2 * matmul, rel=1e-9)
    assert primary.weights_bytes == pytest.approx(2 * model.total_parameters(), rel=1e-9)  # fp8 + transpose = 2 B
    assert parse_training(_h100_fp8(framework="megatron-bridge")).job.fp8_params
    assert not parse_training(_h100_fp8(framework="megatron-bridge", precision="bf16")).job.fp8_params


def test_llm_foundry_runs_an_fa1_class_attention_kernel() -> None:
    setup = parse_training({**_config(framework="llm-foundry", precision="bf16"), "parallel": {"tp": 1, "pp": 1, "zero": 3}})
    assert setup.attention_kernel == "flash1" and setup.fused_attention
    forward, backward, _ = layer_passes(setup, moe=False)
    attention = [op for op in forward + backward if op.kind == "attention"]
    assert len(attention) == 2 and all(op.kernel == "flash1" and op.kernel_rate == 1.0 for op in attention)
    fa2 = parse_training({**_config(framework="llm-foundry", precision="bf16", attention_kernel="flash"),
                          "parallel": {"tp": 1, "pp": 1, "zero": 3}})
    assert all(op.kernel == "flash" for op in layer_passes(fa2, moe=False)[0] if op.kind == "attention")


def test_fp8_bf16_edge_layers_run_16_bit_gemms() -> None:
    # Megatron-Bridge FP8-CS keeps the first and the last transformer layer in bf16
    base = _h100_fp8(framework="megatron-bridge")
    setup = parse_training(base)
    assert setup.fp8_bf16_edge_layers == 1
    assert [layer for layer in range(setup.model.layers) if setup.bf16_layer(layer)] == [0, setup.model.layers - 1]
    fp8 = layer_passes(setup, moe=False)
    bf16 = layer_passes(setup, moe=False, bf16=True)
    assert all(op.precision == "bf16" for ops in bf16 for op in ops if op.kind == "gemm")
    assert not any(op.name.endswith("_fp8_cast") for ops in bf16 for op in ops)
    assert any(op.name.endswith("_fp8_cast") for ops in fp8 for op in ops)
    seconds = lambda edges: simulate_training(  # noqa: E731
        {**base, "training": {**base["training"], "fp8_bf16_edge_layers": edges}}, RunOptions(fidelity="analytic"),
    ).metrics()["iteration_time_s"]
    none, one, two = seconds(0), seconds(1), seconds(2)
    assert none < one < two
    assert two - one == pytest.approx(one - none, rel=1e-6)  # each bf16 layer pair costs the same
    with pytest.raises(ConfigError, match="fp8_bf16_edge_layers = 17"):
        parse_training({**base, "training": {**base["training"], "fp8_bf16_edge_layers": 17}})


def test_per_op_optimizer_kernels_move_the_counted_bytes_of_each_adam_operation() -> None:
    """Composer's DecoupledAdamW (llm-foundry) runs Adam one in-place op per step: 88 bytes per fp32
    parameter against the fused kernel's 28, and torch's gradient clipping always scales (8 more):
    the step costs exactly (88 + 8 - 28) more bytes per parameter of the shard at the same bandwidth."""
    from sim import costmodel
    from sim.training.data_parallel import optimizer_bytes_per_parameter, optimizer_time_s, stage_parameters_per_rank
    from workloads.graph import Op

    assert optimizer_bytes_per_parameter("adam", "bf16", "per_op") - optimizer_bytes_per_parameter("adam", "bf16") == 68.0
    assert optimizer_bytes_per_parameter("sgd", "bf16", "per_op") == optimizer_bytes_per_parameter("sgd", "bf16") + 8.0
    base = {**_config(framework="llm-foundry"), "parallel": {"tp": 1, "pp": 1, "zero": 3}}
    foundry = parse_training(base)
    # the benchmark table's Composer mixed_precision (PURE, and DEFAULT before Composer v0.16.4) reduces
    # in the run's 16-bit dtype ("16bit"): fp16 here, bf16 for a bf16 run; "auto" would reduce in fp32
    assert foundry.optimizer_kernels == "per_op" and foundry.grad_reduce_dtype == "fp16"
    bf16 = {**base, "training": {**base["training"], "precision": "bf16"}}
    pure = parse_training(bf16)
    assert pure.grad_reduce_dtype == "bf16" and pure.grad_reduce_bytes == 2.0
    auto = parse_training({**bf16, "training": {**bf16["training"], "grad_reduce_dtype": "auto"}})
    assert auto.grad_reduce_dtype == "fp32"
    fused = parse_training({**base, "training": {**base["training"], "optimizer_kernels": "fused"}})
    assert fused.optimizer_kernels == "fused" and parse_training(_config()).optimizer_kernels == "fused"
    links = group_links(foundry, 0)
    shard = stage_parameters_per_rank(foundry, 0) / 8
    gpu = foundry.cluster.gpu
    for setup, per_param in ((foundry, 88.0 + 8.0), (fused, 28.0)):
        step = Op(name="optimizer", kind="memory", bytes_moved=shard * (per_param + 6.0 + 4.0 + 4.0 + 8.0))  # + fp16 unscale
        expected = costmodel.op_time_s(step, gpu, precision="fp16", links=links)
        assert optimizer_time_s(setup, 0, links) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ConfigError, match="optimizer_kernels = 'sometimes'; allowed: fused, per_op"):
        parse_training({**base, "training": {**base["training"], "optimizer_kernels": "sometimes"}})


def test_blocking_pipeline_p2p_holds_each_transfer_and_the_receivers_all_gather_on_the_stage() -> None:
    """Megatron-LM 2021-22 (``pipeline_p2p = "blocking"``): a chunk's F holds the transfer of its
    output and, past the first chunk, the TP all-gather that rebuilds its scatter/gather input; B the
    transfer of its input gradient and, before the last chunk, the all-gather of the incoming one. The
    async links then carry nothing, and both fidelities agree; "overlapped" leaves the chunks alone."""
    from hardware.collectives import Collective, collective_time_s
    from sim.training.costs import blocking_p2p_s, chunk_cost

    base = {
        "model": {"name": "gpt3-1.7b"},
        "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 32},
        "training": {"seq_len": 2048, "global_batch": 32, "micro_batch": 2, "precision": "fp16",
                     "framework": "megatron-2021"},
        "parallel": {"tp": 8, "pp": 4},
    }
    blocking = parse_training(base)
    overlapped = parse_training({**base, "parallel": {**base["parallel"], "pipeline_p2p": "overlapped"}})
    assert blocking.pipeline_p2p == "blocking" and overlapped.pipeline_p2p == "overlapped"
    assert parse_training(_config()).pipeline_p2p == "overlapped"  # Megatron-Core
    links = group_links(blocking, 1)
    send = 2 * 2048 * 2304 * 2.0 / 8  # the scatter/gather slice of one micro-batch's activations
    transfer = collective_time_s(Collective.SEND_RECV, send, links["pp"])
    gather = collective_time_s(Collective.ALL_GATHER, send * 8, links["tp"])
    assert transfer > 0 and gather > 0
    assert blocking_p2p_s(blocking, links, send, first=False, last=False) == (transfer + gather, transfer + gather)
    assert blocking_p2p_s(blocking, links, send, first=True, last=False) == (transfer, gather)
    assert blocking_p2p_s(blocking, links, send, first=False, last=True) == (gather, transfer)
    assert blocking_p2p_s(overlapped, links, send, first=False, last=False) == (0.0, 0.0)
    sp = parse_training({**base, "parallel": {**base["parallel"], "sequence_parallel": True}})
    assert blocking_p2p_s(sp, links, send, first=False, last=False) == (transfer, transfer)  # no scatter/gather
    layers = range(6, 12)
    slow = chunk_cost(blocking, layers=layers, first=False, last=False, links=links, layer_cache={}).work
    fast = chunk_cost(overlapped, layers=layers, first=False, last=False, links=links, layer_cache={}).work
    assert slow.forward_s == pytest.approx(fast.forward_s + transfer + gather, rel=1e-12)
    assert slow.backward_input_s == pytest.approx(fast.backward_input_s + transfer + gather, rel=1e-12)
    assert slow.backward_weight_s == fast.backward_weight_s
    assert slow.exposed_comm_s["pp"] == pytest.approx(2 * (transfer + gather), rel=1e-12)
    runs = {fidelity: simulate_training(base, RunOptions(fidelity=fidelity)).metrics()
            for fidelity in ("analytic", "des")}
    assert runs["analytic"]["iteration_time_s"] == pytest.approx(runs["des"]["iteration_time_s"], rel=0.01)
    assert runs["des"]["exposed_communication_s"]["pp"] >= 8 * 2 * (transfer + gather)  # every micro-batch's hops
    faster = {**base, "parallel": {**base["parallel"], "pipeline_p2p": "overlapped"}}
    assert runs["des"]["iteration_time_s"] > simulate_training(faster, RunOptions()).metrics()["iteration_time_s"]
    with pytest.raises(ConfigError, match="pipeline_p2p = 'sometimes'; allowed: overlapped, blocking"):
        parse_training({**base, "parallel": {**base["parallel"], "pipeline_p2p": "sometimes"}})


def test_unfused_linear_bias_adds_the_qkv_bias_kernel_and_a_column_sum_per_biased_projection() -> None:
    """Megatron-LM 2021-22 (``linear_bias = "unfused"``): the QKV matmul is followed by a bias add
    (read + write m x n) whose backward column-sums the output gradient (read m x n); out_proj,
    mlp_up and mlp_down sum their output gradients for their biases in W (rows x n each, the
    row-parallel ones over the sequence-parallel shard). Fused epilogues and bias-free models add nothing."""
    base = {
        "model": {"name": "gpt3-1.7b"},
        "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1, "precision": "fp16", "framework": "megatron-2021"},
        "parallel": {"tp": 2, "pp": 1, "recompute": "full"},
    }
    unfused = parse_training(base)
    assert unfused.linear_bias == "unfused" and parse_training(_config()).linear_bias == "skip_bias_add"
    fused = parse_training({**base, "training": {**base["training"], "linear_bias": "fused"}})
    tokens, h, f = 2048, 2304, 9216
    forward, b_ops, w_ops = layer_passes(unfused, moe=False)
    by_name = {op.name: op for op in forward + b_ops + w_ops}
    assert by_name["qkv_proj_bias_add"].bytes_moved == 2 * tokens * (3 * h // 2) * 2.0
    assert by_name["recompute_qkv_proj_bias_add"].bytes_moved == 2 * tokens * (3 * h // 2) * 2.0  # full recompute
    assert by_name["qkv_proj_bias_add_backward"].bytes_moved == tokens * (3 * h // 2) * 2.0
    assert {op.name: op.bytes_moved for op in w_ops if op.name.endswith("_bias_grad")} == {
        "out_proj_bias_grad": tokens * h * 2.0, "mlp_up_bias_grad": tokens * (f // 2) * 2.0,
        "mlp_down_bias_grad": tokens * h * 2.0}
    sp = parse_training({**base, "parallel": {"tp": 2, "pp": 1, "sequence_parallel": True}})  # no recompute
    sp_grads = {op.name: op.bytes_moved for op in layer_passes(sp, moe=False)[2] if op.name.endswith("_bias_grad")}
    assert sp_grads["out_proj_bias_grad"] == sp_grads["mlp_down_bias_grad"] == tokens // 2 * h * 2.0
    for setup in (fused, parse_training({**base, "model": {"name": "llama3-8b"}})):
        names = [op.name for ops in layer_passes(setup, moe=False) for op in ops]
        assert not [name for name in names if "bias" in name]
    with pytest.raises(ConfigError, match="linear_bias = 'sometimes'; allowed: fused, unfused, skip_bias_add"):
        parse_training({**base, "training": {**base["training"], "linear_bias": "sometimes"}})


def test_megatron_unfused_attention_pays_its_context_permute_and_the_qkv_split_gradient() -> None:
    """Megatron-LM 2021-22 core attention: context.permute(2, 0, 1, 3).contiguous() after the value
    bmm (read + write the context: tokens x hidden / tp), recomputed with the attention; its backward
    prices the concatenation that assembles the QKV output gradient from the Q, K, V views (read +
    write tokens x 3 hidden / tp). Fused attention kernels write the context in place: no such op."""
    base = {
        "model": {"name": "gpt3-1.7b"},
        "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1, "precision": "fp16", "framework": "megatron-2021"},
        "parallel": {"tp": 2, "pp": 1, "recompute": "selective"},
    }
    forward, b_ops, _ = layer_passes(parse_training(base), moe=False)
    names = [op.name for op in forward]
    assert names.index("attention_context_copy") == names.index("attention_values") + 1
    by_name = {op.name: op.bytes_moved for op in forward + b_ops}
    assert by_name["attention_context_copy"] == by_name["recompute_attention_context_copy"] == 2 * 2048 * 1152 * 2.0
    assert by_name["attention_context_copy_backward"] == 2 * 2048 * 3 * 1152 * 2.0
    flash = parse_training({**base, "training": {**base["training"], "attention_kernel": "flash"}})
    assert not [op for ops in layer_passes(flash, moe=False) for op in ops if "context_copy" in op.name]


def test_fp8_weight_casts_run_once_per_step_over_the_fp8_layers_weights() -> None:
    # Transformer Engine recasts a 16-bit weight to fp8 (+ its fp8 transpose: read 2, write 1 + 1 bytes
    # per element) only in the first micro-batch of a step (is_first_microbatch): one memory pass over
    # every fp8 layer's matmul weights per step, whatever the number of micro-batches
    from sim import costmodel
    from sim.training.costs import FP8_WEIGHT_CAST_BYTES, fp8_weight_cast_s
    from sim.training.data_parallel import stage_signatures
    from workloads.graph import Op

    setup = parse_training(_h100_fp8(framework="nemo"))
    model = setup.model
    (signature,) = stage_signatures(setup)
    links = group_links(setup, 0)
    matmul = model.layers * (model.attention_parameters() + model.mlp_parameters(model.ffn_hidden))
    expected = costmodel.op_time_s(Op(name="cast", kind="memory", bytes_moved=FP8_WEIGHT_CAST_BYTES * matmul),
                                   setup.cluster.gpu, precision="fp8", links=links)
    assert FP8_WEIGHT_CAST_BYTES == 4.0
    assert fp8_weight_cast_s(setup, signature, links) == pytest.approx(expected, rel=1e-12)
    # tp shards the weights: a quarter of the bytes on 4 ranks
    tp4 = parse_training({**_h100_fp8(framework="nemo"), "parallel": {"tp": 4, "pp": 1, "zero": 1}})
    (signature4,) = stage_signatures(tp4)
    quarter = costmodel.op_time_s(Op(name="cast", kind="memory", bytes_moved=FP8_WEIGHT_CAST_BYTES * matmul / 4),
                                  tp4.cluster.gpu, precision="fp8", links=group_links(tp4, 0))
    assert fp8_weight_cast_s(tp4, signature4, group_links(tp4, 0)) == pytest.approx(quarter, rel=1e-12)
    # nothing to cast at 16 bits or with fp8 primary weights (the optimizer writes them in fp8)
    for other in (_h100_fp8(framework="nemo", precision="bf16"), _h100_fp8(framework="megatron-bridge")):
        other_setup = parse_training(other)
        assert fp8_weight_cast_s(other_setup, stage_signatures(other_setup)[0], links) == 0.0
    # the bf16 edge layers keep 16-bit GEMMs: no cast
    edges = parse_training(_h100_fp8(framework="nemo", fp8_bf16_edge_layers=1))
    kept = (model.layers - 2) * matmul / model.layers
    assert fp8_weight_cast_s(edges, stage_signatures(edges)[0], links) == pytest.approx(costmodel.op_time_s(
        Op(name="cast", kind="memory", bytes_moved=FP8_WEIGHT_CAST_BYTES * kept), edges.cluster.gpu,
        precision="fp8", links=links), rel=1e-12)


def test_fp8_weight_casts_add_their_seconds_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # the casts run in the first micro-batch only: the step grows by the same seconds at 1 and at 4
    # micro-batches per rank, in both fidelities
    import sim.training.iteration as iteration
    from sim.training.costs import fp8_weight_cast_s
    from sim.training.data_parallel import stage_signatures

    setup = parse_training(_h100_fp8(framework="nemo"))
    cast_s = fp8_weight_cast_s(setup, stage_signatures(setup)[0], group_links(setup, 0))
    assert cast_s > 0.0

    def step_s(config: dict, fidelity: str) -> float:
        return simulate_training(config, RunOptions(fidelity=fidelity)).metrics()["iteration_time_s"]

    for fidelity in ("analytic", "des"):
        for batch in (8, 32):
            config = _h100_fp8(framework="nemo", global_batch=batch)
            with_casts = step_s(config, fidelity)
            with monkeypatch.context() as patch:
                patch.setattr(iteration, "fp8_weight_cast_s", lambda *args: 0.0)
                without = step_s(config, fidelity)
            assert with_casts - without == pytest.approx(cast_s, rel=1e-6)


def test_nemo_stacks_run_the_flash_attn_2_kernel_not_the_calibrated_rows() -> None:
    # NeMo 24.07's launcher disables cuDNN fused attention (NVTE_FUSED_ATTN: 0) and MLPerf v3.1's TE
    # runs flash-attn 2.0.8 first: the FA2 library kernel, priced by the FA2 fit whatever the profile
    for framework in ("nemo", "nemo-1.20"):
        setup = parse_training(_h100_fp8(framework=framework))
        assert setup.attention_kernel == "flash2" and setup.fused_attention
        attention = [op for op in layer_passes(setup, moe=False)[0] if op.kind == "attention"]
        assert attention and all(op.kernel == "flash2" for op in attention)
    assert parse_training(_h100_fp8(framework="megatron-core")).attention_kernel == "cudnn"
    with pytest.raises(ConfigError, match="flash2, flash1, cudnn"):
        parse_training(_h100_fp8(framework="nemo", attention_kernel="flash4"))


def test_megatron_core_and_bridge_run_cudnn_fused_attention_not_the_calibrated_rows() -> None:
    # Transformer Engine >= 1.2 gives cuDNN FusedAttention preference over flash-attn on sm90 and
    # neither stack overrides it: the cuDNN kernel at its measured H100 rate relative to FA2, not the
    # calibration profile's rows (they time TensorRT-LLM's FMHA), at the grid occupancy those rows measure
    # for its sequences x heads
    from hardware import cost
    from hardware.catalog import analytic_gpu

    for framework in ("megatron-core", "megatron-bridge"):
        setup = parse_training(_h100_fp8(framework=framework))
        assert setup.attention_kernel == "cudnn" and setup.fused_attention
        attention = [op for op in layer_passes(setup, moe=False)[0] if op.kind == "attention"]
        assert attention and all(op.kernel == "cudnn" for op in attention)
        shipped = setup.cluster.gpu
        assert shipped.calibration is not None
        op = attention[0]
        args = dict(heads=op.heads, kv_heads=op.kv_heads, head_dim=op.head_dim, precision="bf16",
                    bytes_per_element=2, kernel="cudnn", kernel_rate=op.kernel_rate)
        share = shipped.calibration.attention_grid_occupancy(
            precision="bf16", num_sequences=len(op.sequences), query_tokens=sum(q for q, _ in op.sequences),
            heads=op.heads, head_dim=op.head_dim)
        analytic = analytic_gpu(shipped.name)
        for backward in (False, True):
            assert (cost.attention_time_s(shipped, op.sequences, backward=backward, **args) - cost.launch_overhead_s(shipped)
                    == pytest.approx((cost.attention_time_s(analytic, op.sequences, backward=backward, **args)
                                      - cost.launch_overhead_s(analytic)) / share, rel=1e-12))
def test_megatron_ddp_grad_buffer_passes_cost_four_passes_over_the_whole_buffer() -> None:
    """Megatron-Core's DDP (``grad_buffer_passes = "megatron_ddp"``) zeroes, NaN-checks and pre-scales
    the rank's whole fp32 gradient buffer each iteration under the distributed optimizer (ZeRO 1):
    the step costs the shard's optimizer bytes less its zeroing plus one memory op of 4 x 4 bytes per
    parameter of the rank; with "shard" only the optimizer op over the shard."""
    from sim import costmodel
    from sim.training.data_parallel import (
        MEGATRON_DDP_GRAD_BUFFER_PASSES, optimizer_bytes_per_parameter, optimizer_time_s, stage_parameters_per_rank,
    )
    from workloads.graph import Op

    base = {**_config(precision="bf16"), "parallel": {"tp": 1, "pp": 1, "zero": 1}}
    mcore = parse_training(base)
    assert mcore.framework == "megatron-core" and mcore.grad_buffer_passes == "megatron_ddp"
    shard_only = parse_training({**base, "training": {**base["training"], "grad_buffer_passes": "shard"}})
    assert parse_training(_config(framework="nemo", precision="bf16")).grad_buffer_passes == "shard"
    links = group_links(mcore, 0)
    params = stage_parameters_per_rank(mcore, 0)
    shard = params / 8
    gpu = mcore.cluster.gpu
    per_param = optimizer_bytes_per_parameter("adam", "bf16")
    step = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * (per_param - 4.0)), gpu,
                               precision="bf16", links=links)
    buffer = costmodel.op_time_s(Op(name="grad_buffer", kind="memory", bytes_moved=4.0 * 4.0 * params), gpu,
                                 precision="bf16", links=links)
    assert MEGATRON_DDP_GRAD_BUFFER_PASSES == 4.0 and mcore.grad_reduce_bytes == 4.0
    assert optimizer_time_s(mcore, 0, links) == pytest.approx(step + buffer, rel=1e-12)
    alone = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * per_param), gpu,
                                precision="bf16", links=links)
    assert optimizer_time_s(shard_only, 0, links) == pytest.approx(alone, rel=1e-12)
    # ZeRO 3 shards the gradients: the passes cover the shard only
    zero3 = parse_training({**base, "parallel": {"tp": 1, "pp": 1, "zero": 3}})
    z3_links = group_links(zero3, 0)
    z3_buffer = costmodel.op_time_s(Op(name="grad_buffer", kind="memory", bytes_moved=16.0 * shard), gpu,
                                    precision="bf16", links=z3_links)
    z3_step = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * (per_param - 4.0)), gpu,
                                  precision="bf16", links=z3_links)
    assert optimizer_time_s(zero3, 0, z3_links) == pytest.approx(z3_step + z3_buffer, rel=1e-12)
    with pytest.raises(ConfigError, match="grad_buffer_passes = 'always'; allowed: shard, megatron_ddp"):
        parse_training({**base, "training": {**base["training"], "grad_buffer_passes": "always"}})


def test_qkv_split_concatenates_the_gradients_and_copies_v_after_rope() -> None:
    """``qkv_split``: "concat" adds no forward kernel and a backward op of 2 x the QKV output (read
    dQ, dK, dV, write the QKV gradient) after RoPE's backward, before the QKV dgrad; "concat_copy_v"
    also copies V (read and write the rank's kv_heads x head_dim columns) when the model has RoPE;
    "none" adds nothing. The materialised-scores path prices its own split (unchanged)."""
    base = {
        "model": {"name": "llama2-7b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "precision": "bf16"},
        "parallel": {"tp": 2, "pp": 1, "sequence_parallel": True},
    }

    def passes(value: str):  # type: ignore[no-untyped-def]
        setup = parse_training({**base, "training": {**base["training"], "qkv_split": value}})
        assert setup.qkv_split == value
        return setup, layer_passes(setup, moe=False)

    setup, (f_none, b_none, _) = passes("none")
    assert parse_training(base).qkv_split == "concat_copy_v"  # megatron-core, the default stack
    qkv = next(op for op in f_none if op.name == "qkv_proj")
    _, (f_cat, b_cat, _) = passes("concat")
    assert [op.name for op in f_cat] == [op.name for op in f_none]  # views: no forward kernel
    names = [op.name for op in b_cat]
    split = b_cat[names.index("qkv_split_backward")]
    assert split.bytes_moved == 2.0 * qkv.m * qkv.n * 2.0 and qkv.n == (16 + 2 * 16) * 128
    assert names.index("rope_backward") < names.index("qkv_split_backward") < names.index("qkv_proj_dgrad")
    _, (f_copy, b_copy, _) = passes("concat_copy_v")
    copy = next(op for op in f_copy if op.name == "qkv_split")
    assert [op.name for op in f_copy].index("qkv_split") == [op.name for op in f_copy].index("qkv_proj") + 1
    assert copy.bytes_moved == 2.0 * qkv.m * 16 * 128 * 2.0  # V of the rank's 16 KV heads, read + written
    assert next(op for op in b_copy if op.name == "qkv_split_backward").bytes_moved == split.bytes_moved
    # learned positions: Q, K, V stay views of one buffer, TE finds its layout: no copy
    learned = {**base, "model": {"name": "gpt3-1.7b"}, "training": {**base["training"], "seq_len": 2048}}
    gpt = parse_training(learned)
    assert not any(op.name == "qkv_split" for op in layer_passes(gpt, moe=False)[0])
    assert any(op.name == "qkv_split_backward" for op in layer_passes(gpt, moe=False)[1])
    old = parse_training({**learned, "training": {**learned["training"], "framework": "megatron-2021", "precision": "fp16"}})
    assert not any(op.name.startswith("qkv_split") for ops in layer_passes(old, moe=False) for op in ops)
    with pytest.raises(ConfigError, match="qkv_split = 'always'; allowed: none, concat, concat_copy_v"):
        parse_training({**base, "training": {**base["training"], "qkv_split": "always"}})


def test_te1_delayed_scaling_waits_for_a_blocking_amax_all_reduce_per_chunk_pass() -> None:
    # TE 1.x reduce_and_update_fp8_tensors: one all-reduce (MAX, async_op=False) of the chunk's amaxes
    # (3 per fp8 GEMM forward, 2 backward, fp32) over the stage's ranks at each fp8_autocast exit and in
    # backward: exposed on the compute stream, per chunk and micro-batch
    from hardware.collectives import Collective, collective_time_s
    from sim.training.costs import chunk_cost, fp8_amax_reduction_s, fp8_gemms_per_layer

    config = {**_h100_fp8(framework="nemo"), "parallel": {"tp": 1, "pp": 1, "zero": 1}}
    setup = parse_training(config)
    links = group_links(setup, 0)
    gemms = fp8_gemms_per_layer(setup, False)
    assert gemms == 4  # qkv, out, fc1, fc2
    forward, backward = fp8_amax_reduction_s(setup, links, 3 * gemms)
    assert forward == collective_time_s(Collective.ALL_REDUCE, 4.0 * 3 * 3 * gemms, links["dp"]) > 0.0
    assert backward == collective_time_s(Collective.ALL_REDUCE, 4.0 * 2 * 3 * gemms, links["dp"]) > 0.0
    chunk = chunk_cost(setup, layers=range(3), first=False, last=False, links=links, layer_cache={})
    # the same chunk of a stack without it (MLPerf's 2023 TE: asynchronous, TP-only) is that much faster
    per_module = parse_training({**config, "training": {**config["training"], "fp8_scale_update": "per_module"}})
    assert fp8_amax_reduction_s(per_module, links, 3 * gemms) == (0.0, 0.0)
    assert chunk.work.exposed_comm_s["dp"] == pytest.approx(forward + backward, rel=1e-12)
    # none at 16 bits, with current scaling, or on one rank
    for other in (_h100_fp8(framework="nemo", precision="bf16"), _h100_fp8(framework="nemo", fp8_recipe="current")):
        assert fp8_amax_reduction_s(parse_training(other), links, 12) == (0.0, 0.0)
    one = parse_training({**_h100_fp8(framework="nemo"), "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1}})
    assert fp8_amax_reduction_s(one, group_links(one, 0), 12) == (0.0, 0.0)


def test_skip_bias_add_keeps_the_qkv_bias_in_its_epilogue_and_column_sums_the_others() -> None:
    """Megatron-Core (``linear_bias = "skip_bias_add"``, the nemo / megatron-core / megatron-bridge
    stacks): no bias-add kernel (the QKV bias rides in TE's GEMM epilogue, the others in
    bias_dropout_add / bias_gelu), and W gets the column sums of out_proj, mlp_up and mlp_down, one
    read of each output gradient (16-bit activations also under fp8)."""
    base = {
        "model": {"name": "gpt3-1.7b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 2048, "global_batch": 16, "micro_batch": 2, "precision": "fp8", "framework": "nemo"},
        "parallel": {"tp": 1, "pp": 1},
    }
    setup = parse_training(base)
    assert setup.linear_bias == "skip_bias_add"
    tokens, h, f = 2 * 2048, 2304, 9216
    forward, b_ops, w_ops = layer_passes(setup, moe=False)
    names = [op.name for op in forward + b_ops + w_ops]
    assert not [name for name in names if "bias_add" in name]
    assert {op.name: op.bytes_moved for op in w_ops if op.name.endswith("_bias_grad")} == {
        "out_proj_bias_grad": tokens * h * 2.0, "mlp_up_bias_grad": tokens * f * 2.0,
        "mlp_down_bias_grad": tokens * h * 2.0}
    fused = parse_training({**base, "training": {**base["training"], "linear_bias": "fused"}})
    assert not [op for op in layer_passes(fused, moe=False)[2] if op.name.endswith("_bias_grad")]
    llama = parse_training({**base, "model": {"name": "llama3-8b"}})  # bias-free: nothing to reduce
    assert not [op.name for ops in layer_passes(llama, moe=False) for op in ops if "bias" in op.name]


def test_flash_bshd_layout_copies_qkv_and_the_output_of_micro_batches_above_one() -> None:
    """``attention_layout = "flash_bshd"`` (nemo: TE 1.x's flash-attn backend on sbhd tensors): Q, K
    and V interleaved in the QKV output (learned positions) are copied into [b, s] order at any
    micro-batch (2 x the QKV output's elements, on the split's forward); after RoPE (contiguous Q, K
    and the copied V) only when the micro-batch is above 1; the output is copied back after the
    kernel and its gradient reshaped (a copy) in backward when the micro-batch is above 1, 2 x its
    elements each. The split's backward (the packed gradient) is unchanged; "native" adds nothing."""
    def passes(model: str, micro_batch: int, layout: str, seq: int = 2048):  # type: ignore[no-untyped-def]
        config = {
            "model": {"name": model},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"seq_len": seq, "global_batch": 8 * micro_batch, "micro_batch": micro_batch,
                         "precision": "bf16", "framework": "nemo", "attention_layout": layout},
            "parallel": {"tp": 1, "pp": 1},
        }
        setup = parse_training(config)
        assert setup.attention_layout == layout
        forward, b_ops, _ = layer_passes(setup, moe=False)
        return {op.name: op for op in forward}, {op.name: op for op in b_ops}

    h = 2304  # gpt3-1.7b: learned positions, 24 heads of 96
    for b in (1, 4):
        f_native, b_native = passes("gpt3-1.7b", b, "native")
        f_bshd, b_bshd = passes("gpt3-1.7b", b, "flash_bshd")
        tokens = b * 2048
        assert "qkv_split" not in f_native  # views: no forward kernel
        assert f_bshd["qkv_split"].bytes_moved == 2.0 * tokens * 3 * h * 2.0
        assert b_bshd["qkv_split_backward"].bytes_moved == b_native["qkv_split_backward"].bytes_moved
        names = list(f_bshd)
        if b == 1:
            assert "attention_output_layout" not in f_bshd and "attention_output_layout_backward" not in b_bshd
        else:
            assert names.index("attention") + 1 == names.index("attention_output_layout")
            assert f_bshd["attention_output_layout"].bytes_moved == 2.0 * tokens * h * 2.0
            assert b_bshd["attention_output_layout_backward"].bytes_moved == 2.0 * tokens * h * 2.0
    # RoPE (llama2-7b, 32 heads of 128): micro-batch 1 keeps concat_copy_v's V copy alone
    one_native, _ = passes("llama2-7b", 1, "native", seq=4096)
    one_bshd, _ = passes("llama2-7b", 1, "flash_bshd", seq=4096)
    assert one_bshd["qkv_split"].bytes_moved == one_native["qkv_split"].bytes_moved == 2.0 * 4096 * 4096 * 2.0
    two_bshd, _ = passes("llama2-7b", 2, "flash_bshd", seq=4096)
    assert two_bshd["qkv_split"].bytes_moved == 2.0 * 8192 * 4096 * 2.0 + 2.0 * 8192 * 3 * 4096 * 2.0
    with pytest.raises(ConfigError, match="attention_layout = 'bshd'; allowed: native, flash_bshd"):
        passes("gpt3-1.7b", 1, "bshd")


def test_flash_bshd_on_te_transformer_layer_copies_the_packed_qkv_both_ways() -> None:
    """``attention_layout = "flash_bshd"`` with ``qkv_split = "none"`` (nemo-1.17 / nemo-1.20: TE 0.8 /
    09ba8427 TransformerLayer, whose split backward is a no-op): the MLPerf GPT-3 layer (TP4, seq 2048,
    24 heads of 128 per rank, learned positions) gets an op of its own before the attention kernel,
    fa_prepare_fwd in forward and fa_prepare_bwd in backward, each reading and writing the rank's
    QKV output: 2 x 2048 x 3 x 3072 x 2 bytes = 75,497,472 at micro-batch 1, where the output needs
    no copy; at micro-batch 2 both double and the output copy (2 x 4096 x 3072 x 2 bytes each way)
    follows the kernel. "native" adds nothing."""
    def passes(framework: str, micro_batch: int, layout: str | None = None):  # type: ignore[no-untyped-def]
        training = {"seq_len": 2048, "global_batch": 8 * micro_batch, "micro_batch": micro_batch,
                    "precision": "fp8", "framework": framework}
        if layout is not None:
            training["attention_layout"] = layout
        setup = parse_training({
            "model": {"name": "gpt3-175b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": training,
            "parallel": {"tp": 4, "pp": 8, "sequence_parallel": True},
        })
        forward, b_ops, _ = layer_passes(setup, moe=False)
        return setup, [op.name for op in forward], {op.name: op for op in forward + b_ops}

    qkv_bytes = 2048 * 3 * 12288 // 4 * 2.0  # one micro-batch's QKV output per rank, bf16
    for framework in ("nemo-1.17", "nemo-1.20"):
        setup, names, ops = passes(framework, 1)
        assert (setup.attention_layout, setup.qkv_split) == ("flash_bshd", "none")  # the stacks' defaults
        assert names.index("qkv_proj") < names.index("attention_input_layout") == names.index("attention") - 1
        assert ops["attention_input_layout"].bytes_moved == 2.0 * qkv_bytes == 75_497_472
        assert ops["attention_input_layout_backward"].bytes_moved == 2.0 * qkv_bytes
        assert not [name for name in ops if name.startswith(("attention_output_layout", "qkv_split"))]
        _, _, two = passes(framework, 2)
        assert two["attention_input_layout"].bytes_moved == two["attention_input_layout_backward"].bytes_moved \
            == 2.0 * 2.0 * qkv_bytes
        assert two["attention_output_layout"].bytes_moved == two["attention_output_layout_backward"].bytes_moved \
            == 2.0 * 4096 * 3072 * 2.0
        _, _, native = passes(framework, 2, "native")
        assert not [name for name in native if "layout" in name]


def test_torch_compile_fuses_the_amax_of_torchao_casts_into_the_producing_kernels() -> None:
    # torchtitan's float8 (current scaling, every cast a kernel): eager, each cast reads its input twice
    # (amax, then cast-transpose: 2 + 2 + 1 + 1 B per element); under torch.compile the Inductor kernel
    # that produces the input takes the amax (fp8_cast_fusion "compiled"): the norms, the activation and
    # the attention output's layout copy forward, the activation's, RoPE's and the second norm's backward,
    # but not the block output's gradient, which the next block's compiled graph produces
    m, h, f = 4096, 4096, 11008

    def casts(**training) -> dict[str, float]:
        forward, backward, _ = layer_passes(parse_training(_fp8(framework="torchtitan", **training)), moe=False)
        return {op.name: op.bytes_moved for op in forward + backward if op.name.endswith("_fp8_cast")}

    eager = casts()
    assert parse_training(_fp8(framework="torchtitan")).fp8_cast_fusion == "none"
    assert all(eager[name] == 6 * m * n for name, n in (("qkv_proj_fp8_cast", h), ("mlp_down_fp8_cast", f),
                                                          ("mlp_down_dgrad_fp8_cast", h)))
    compiled = casts(compile=True)
    assert compiled == {"qkv_proj_fp8_cast": 4 * m * h, "out_proj_fp8_cast": 4 * m * h, "mlp_up_fp8_cast": 4 * m * h,
                        "mlp_down_fp8_cast": 4 * m * f, "mlp_down_dgrad_fp8_cast": 6 * m * h,
                        "mlp_up_dgrad_fp8_cast": 4 * m * 2 * f, "out_proj_dgrad_fp8_cast": 4 * m * h,
                        "qkv_proj_dgrad_fp8_cast": 4 * m * 3 * h}
    # a fusion the config names wins over compile's; Transformer Engine's modules stay opaque to Inductor
    assert casts(compile=True, fp8_cast_fusion="none") == eager
    assert parse_training(_fp8(compile=True)).fp8_cast_fusion == "norm"
