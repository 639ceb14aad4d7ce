"""Context parallelism by head all-to-all (DeepSpeed-Ulysses) and 2D head x context (LoongTrain
hybrid) beside the K/V ring: communication volumes, the head rule, and which wins where."""

from __future__ import annotations

import contextlib
import io

import pytest

from sim.cli import main
from sim.training.config import parse_training
from sim.training.costs import layer_passes
from sim.training.estimate import estimate_training
from tests.test_examples_training import EXAMPLES, simulate

HYBRID = EXAMPLES / "train-hybrid-cp.toml"


def config(model: str, gpus: int, cp: int, seq: int, comm: str, cp_heads: int = 1) -> dict:
    parallel = {"tp": 1, "pp": 1, "cp": cp, "dp": "auto", "zero": 1, "recompute": "full", "cp_comm": comm}
    if comm == "hybrid":
        parallel["cp_heads"] = cp_heads
    return {
        "model": {"name": model},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": gpus, "node": "dgx-h100"},
        "training": {"seq_len": seq, "global_batch": gpus // cp, "micro_batch": 1},
        "parallel": parallel,
    }


def cp_bytes(cfg: dict) -> dict[str, float]:
    forward, _, _ = layer_passes(parse_training(cfg), moe=False)
    return {op.name: op.message_bytes for op in forward if op.name.startswith("cp_")}


def test_ulysses_volume_does_not_grow_with_cp_but_the_ring_does() -> None:
    # Jacobs et al. 2023: the all-to-all moves each rank's Q, K, V and output once, whatever cp;
    # a ring passes cp - 1 K/V blocks
    for cp in (4, 8):
        s = 8192
        ulysses = cp_bytes(config("llama2-7b", cp, cp, s, "ulysses"))
        ring = cp_bytes(config("llama2-7b", cp, cp, s, "ring"))
        tokens, h = s // cp, 4096
        assert ulysses == {"cp_qkv_all_to_all": tokens * 3 * h * 2.0, "cp_out_all_to_all": tokens * h * 2.0}
        assert ring == {"cp_kv_ring": (cp - 1) * tokens * 2 * h * 2.0}


def test_ulysses_needs_heads_divisible_by_cp() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["simulate", str(EXAMPLES / "train-llama3.1-405b-cp.toml"), "--set", "parallel.cp_comm=ulysses"])
    assert code == 2 and "must divide the 8 kv_heads" in err.getvalue()


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_hybrid_beats_ring_and_ulysses_across_two_nodes(fidelity: str) -> None:
    # LoongTrain (arXiv 2406.18485): head all-to-all inside the node, ring across nodes
    hybrid = simulate(HYBRID, fidelity)
    ring = simulate(HYBRID, fidelity, "parallel.cp_comm=ring", "parallel.cp_heads=1")
    ulysses = simulate(HYBRID, fidelity, "parallel.cp_comm=ulysses", "parallel.cp_heads=1")
    assert hybrid["iteration_time_s"] < ulysses["iteration_time_s"] < ring["iteration_time_s"]


def test_crossover_the_ring_wins_with_few_kv_heads_ulysses_at_large_cp() -> None:
    def time(model: str, gpus: int, cp: int, seq: int, comm: str) -> float:
        return estimate_training(parse_training(config(model, gpus, cp, seq, comm)))["iteration_time_s"]

    # GQA (8 KV heads of 32): the ring passes a quarter of what MHA would and hides it behind
    # attention inside the node; Ulysses still moves all of Q and the output
    assert time("llama3-8b", 8, 8, 8192, "ring") < time("llama3-8b", 8, 8, 8192, "ulysses")
    # MHA over two nodes at cp = 16: 15 ring steps over InfiniBand cannot hide; Ulysses' constant
    # volume wins
    assert time("llama2-7b", 16, 16, 16384, "ulysses") < time("llama2-7b", 16, 16, 16384, "ring")
