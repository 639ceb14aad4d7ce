"""The last gradient bucket of the stage holding the input embedding: the embedding's backward is the
model's last op, so its gradient (with the leftover of the first layer, Megatron's DDP filling buckets
in reverse parameter order; FSDP's root unit with the tables it holds) is reduced after the backward."""

from __future__ import annotations

import pytest

from hardware.collectives import Collective, collective_time_s
from sim.runner import RunOptions
from sim.training.config import parse_training
from sim.training.costs import group_links
from sim.training.data_parallel import (
    BUCKET_PARAMETERS,
    closing_gradient_parameters,
    grad_sync_work,
    stage_parameters_per_rank,
    stage_signatures,
)
from sim.training.run import simulate_training

EXACT = 1e-12
TABLE = 128_256 * 4096  # llama3-8b's embedding (and untied LM head) parameters


def _config(pp: int = 1, zero: int = 1, tp: int = 1, micro_batches: int = 1) -> dict:
    dp = 16 // (tp * pp)
    return {
        "model": {"name": "llama3-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "node": "dgx-h100", "network": "ib-ndr-fat-tree", "num_gpus": 16},
        "training": {"seq_len": 4096, "global_batch": dp * micro_batches, "micro_batch": 1, "precision": "bf16",
                     "framework": "megatron-core"},
        "parallel": {"tp": tp, "pp": pp, "zero": zero, "sequence_parallel": tp > 1},
    }


def test_the_embedding_closes_the_last_bucket_of_its_stage_only() -> None:
    setup = parse_training(_config(pp=2, tp=2))
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * setup.plan.dp)
    grad_bytes = setup.grad_reduce_bytes
    for stage, closing in ((0, TABLE / 2), (1, 0.0)):  # stage 1 holds the LM head, reduced early
        assert closing_gradient_parameters(setup, stage_signatures(setup)[stage]) == closing
        params = stage_parameters_per_rank(setup, stage)
        buckets = grad_sync_work(setup, stage, group_links(setup, stage))
        full = int((params - closing) // bucket)
        assert len(buckets) == full + 1
        assert all(b.message_bytes == bucket * grad_bytes for b in buckets[:-1])
        assert buckets[-1].message_bytes == pytest.approx((params - full * bucket) * grad_bytes, rel=EXACT)
        assert sum(b.message_bytes for b in buckets) == pytest.approx(params * grad_bytes, rel=EXACT)  # bytes kept
    assert grad_sync_work(setup, 0, group_links(setup, 0))[-1].message_bytes > TABLE / 2 * grad_bytes


def test_fsdp_by_layer_closes_with_its_root_unit() -> None:
    by_layer = parse_training(_config(zero=3))
    assert by_layer.fsdp_unit == "layer"
    signature = stage_signatures(by_layer)[0]
    assert closing_gradient_parameters(by_layer, signature) == 2 * TABLE  # untied: embedding and LM head
    chunk = parse_training({**_config(zero=3), "training": {**_config()["training"], "fsdp_unit": "chunk"}})
    assert closing_gradient_parameters(chunk, signature) == TABLE


@pytest.mark.parametrize("fidelity", ["des", "analytic"])
def test_the_last_bucket_is_exposed_after_the_backward(fidelity: str) -> None:
    # one micro-batch without a pipeline: the backward's end is the step's, so at least the last bucket's
    # reduce-scatter (the embedding's, ready only then) and the first forward's wait for its gather are exposed
    config = _config()
    setup = parse_training(config)
    links = group_links(setup, 0)
    last = grad_sync_work(setup, 0, links)[-1]
    gather = collective_time_s(Collective.ALL_GATHER, last.message_bytes / setup.grad_reduce_bytes * 2.0, links["dp"])
    exposed = simulate_training(config, RunOptions(fidelity=fidelity)).metrics()["exposed_communication_s"]["dp"]
    assert exposed >= last.duration_s + gather - 1e-12
    assert last.duration_s > 0.0


def test_a_tied_table_closes_its_first_stage_once() -> None:
    # gpt3-1.7b ties its embedding and LM head: one table on a one-stage plan, the first stage's copy under
    # a pipeline (the last stage's copy is its LM head, reduced early)
    base = {"model": {"name": "gpt3-1.7b"},
            "cluster": {"gpu": "a100-sxm-80gb", "node": "dgx-a100", "network": "ib-hdr-fat-tree", "num_gpus": 16},
            "training": {"seq_len": 2048, "global_batch": 16, "micro_batch": 1, "precision": "bf16"},
            "parallel": {"tp": 1, "zero": 1}}
    setup = parse_training({**base, "parallel": {**base["parallel"], "pp": 1}})
    assert setup.model.tied_embeddings
    table = setup.model.vocab * setup.model.hidden
    assert closing_gradient_parameters(setup, stage_signatures(setup)[0]) == table
    piped = parse_training({**base, "parallel": {**base["parallel"], "pp": 2}})
    signatures = stage_signatures(piped)
    assert [closing_gradient_parameters(piped, s) for s in signatures] == [table, 0.0]
