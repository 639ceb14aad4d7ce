"""The model catalog against published sizes, closed-form FLOP/parameter formulas and KV-cache sizes."""

from __future__ import annotations

import pytest

from workloads.catalog import default_models, get_model, model_from_mapping
from workloads.errors import ModelCatalogError
from workloads.precision import bytes_per_element

NARAYANAN_ROWS = [  # Narayanan et al. 2021 (arXiv 2104.04473) Table 1: name, hidden, layers
    ("gpt3-1.7b", 2304, 24),
    ("gpt3-3.6b", 3072, 30),
    ("gpt3-7.5b", 4096, 36),
    ("gpt3-18.4b", 6144, 40),
    ("gpt3-39.1b", 8192, 48),
    ("gpt3-76.1b", 10240, 60),
    ("gpt3-145.6b", 12288, 80),
    ("gpt3-310.1b", 16384, 96),
    ("gpt3-529.6b", 20480, 105),
    ("gpt3-1t", 25600, 128),
]
EXPECTED_NAMES = {name for name, _, _ in NARAYANAN_ROWS} | {
    "gpt-22b", "gpt3-175b", "mt-nlg-530b",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b", "llama3.2-1b",
    "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "gpt-j-6b", "falcon-180b",
    "opt-6.7b", "opt-13b", "opt-30b", "opt-66b", "opt-175b",
    "bloom-176b", "qwen2.5-72b", "qwen3-30b-a3b", "nemotron4-340b", "deepseek-v3",
}  # fmt: skip
MODELS = default_models()
NAMES = sorted(MODELS)

LLAMA2_7B = {  # a valid inline architecture to perturb in the error tests
    "name": "inline", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn_hidden": 11008,
    "vocab": 32000, "max_seq_len": 4096, "activation": "swiglu", "norm": "rmsnorm",
}  # fmt: skip


def test_catalog_holds_exactly_the_listed_models():
    assert set(MODELS) == EXPECTED_NAMES


@pytest.mark.parametrize("name", NAMES)
def test_total_parameters_match_published(name):
    model = MODELS[name]
    assert model.published_parameters is not None, f"{name}: no published_parameters"
    total, published = model.total_parameters(), model.published_parameters
    # 1 %, or half the rounding step of a coarsely printed figure ("1.7" B is anything in 1.65..1.75 B)
    tolerance = max(0.01 * published, 0.5 * (model.published_parameters_rounding or 0.0))
    assert abs(total - published) <= tolerance, (
        f"{name}: computed {total / 1e9:.3f} B vs published {published / 1e9:.3f} B "
        f"({100 * (total - published) / published:+.2f} %, allowed {100 * tolerance / published:.2f} %)"
    )


def test_rounding_allowance_is_only_used_where_published_figures_are_coarse():
    # The half-step allowance must stay narrow: never more than 4 % of the published size.
    for name, model in MODELS.items():
        if model.published_parameters_rounding:
            assert 0.5 * model.published_parameters_rounding <= 0.04 * model.published_parameters, name


@pytest.mark.parametrize(
    ("name", "published_active", "rel"),
    [
        # Jiang et al. 2024 (arXiv 2401.04088): 12.9B active ("13B active" in the abstract)
        ("mixtral-8x7b", 12.9e9, 0.02),
        # mistral.ai/news/mixtral-8x22b: 39B active of 141B
        ("mixtral-8x22b", 39e9, 0.02),
        # DeepSeek-AI 2024 (arXiv 2412.19437) abstract: 37B activated. The count here includes the
        # 0.93B input embedding; the weights README's 36.6B leaves it out (checked below), so +1.5 %.
        ("deepseek-v3", 37e9, 0.025),
    ],
)
def test_moe_active_parameters_match_published(name, published_active, rel):
    active = MODELS[name].active_parameters()
    assert active == pytest.approx(published_active, rel=rel), f"{name}: {active / 1e9:.2f} B active"


def test_deepseek_v3_active_without_input_embedding_matches_weights_readme():
    # deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: main model 671B total, 36.6B activated incl. the
    # 0.9B output head; the input embedding lookup is not counted as activated.
    model = MODELS["deepseek-v3"]
    active_compute = model.active_parameters() - model.vocab * model.hidden
    assert active_compute == pytest.approx(36.6e9, rel=0.005)
    assert model.total_parameters() == pytest.approx(671e9, rel=0.001)


def test_dense_models_active_equals_total():
    for name, model in MODELS.items():
        if not model.is_moe:
            assert model.active_parameters() == model.total_parameters(), name


@pytest.mark.parametrize("name", NAMES)
def test_structural_rules(name):
    m = MODELS[name]
    assert m.vocab > 0 and m.layers > 0 and m.hidden > 0 and m.max_seq_len > 0
    assert m.heads % m.kv_heads == 0
    assert m.kv_heads <= m.heads
    if m.is_mla:
        assert m.qk_nope_head_dim > 0 and m.qk_rope_head_dim > 0 and m.v_head_dim > 0
        assert m.kv_lora_rank < m.hidden and m.q_lora_rank < m.hidden
    else:
        # Qwen3 publishes head_dim 128 with 32 heads over hidden 2048 (its config.json); every other
        # catalog model has head_dim = hidden / heads
        assert m.head_dim * m.heads == (4096 if name == "qwen3-30b-a3b" else m.hidden)
    if m.is_moe:
        assert 0 < m.experts_per_token <= m.experts
        assert 0 <= m.dense_layers < m.layers
        assert m.expert_ffn_hidden > 0
        assert m.active_parameters() < m.total_parameters()
    else:
        assert m.ffn_hidden > 0
    if m.sliding_window is not None:
        assert 0 < m.sliding_window <= m.max_seq_len
    if m.rotary_dim is not None:
        assert m.position == "rope" and 0 < m.rotary_dim <= m.head_dim
    assert m.source, f"{name}: every entry cites a source"


@pytest.mark.parametrize(("name", "h", "layers"), NARAYANAN_ROWS)
def test_narayanan_eq2_parameter_count(name, h, layers):
    """Eq. 2, 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h)), equals the count minus the final LayerNorm (2h)."""
    m = MODELS[name]
    assert (m.hidden, m.layers, m.vocab, m.max_seq_len) == (h, layers, 51200, 2048)
    v, s = m.vocab, m.max_seq_len
    eq2 = 12 * layers * h * h + 13 * layers * h + (v + s) * h  # Eq. 2 multiplied out (exact integers)
    assert m.total_parameters() == eq2 + 2 * h
    assert m.total_parameters() == pytest.approx(eq2, rel=0.01)


@pytest.mark.parametrize("name", [row[0] for row in NARAYANAN_ROWS] + ["gpt-22b", "gpt3-175b", "mt-nlg-530b"])
def test_korthikanti_model_flops(name):
    """3 x forward FLOPs x tokens == 72 B s L h^2 (1 + s/(6h) + V/(12hL)) (Korthikanti et al. 2022).

    The brief allowed 0.5 % for biases and position tables; they are not matmuls and are excluded
    from ``matmul_parameters_per_token``, so the two counts agree to rounding error (1e-12).
    """
    m = MODELS[name]
    batch, s, h, layers, v = 1536, m.max_seq_len, m.hidden, m.layers, m.vocab
    model_flops = 3 * m.forward_flops_per_token(s) * batch * s
    korthikanti = 72 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * h * layers))
    assert model_flops == pytest.approx(korthikanti, rel=1e-12)


def test_forward_flops_per_token_small_case():
    # A 1-layer MHA GeLU model, h = 8, V = 10, f = 32: matmul weights 4h^2 + 2hf + Vh = 256 + 512 + 80.
    m = model_from_mapping(
        {"name": "tiny", "layers": 1, "hidden": 8, "heads": 2, "kv_heads": 2, "ffn_hidden": 32, "vocab": 10,
         "max_seq_len": 16, "bias": True, "position": "learned", "tied_embeddings": True},  # fmt: skip
        "test",
    )
    assert m.matmul_parameters_per_token() == 256 + 512 + 80
    # + 4 L h s attention (QK^T and AV) at context 16
    assert m.forward_flops_per_token(16) == 2 * (256 + 512 + 80) + 4 * 1 * 8 * 16
    # params: weights 768, biases 4h + f + h = 72, 2 LNs 32, tied table 80, positions 128, final LN 16
    assert m.total_parameters() == 768 + 72 + 32 + 80 + 128 + 16


def test_kv_cache_llama3_70b_bf16_exact():
    model = get_model("llama3-70b")
    assert model.kv_cache_bytes_per_token(bytes_per_element("bf16")) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_kv_cache_deepseek_v3_mla():
    model = get_model("deepseek-v3")
    for precision in ("bf16", "fp8"):
        b = bytes_per_element(precision)
        assert model.kv_cache_bytes_per_token(b) == 61 * (512 + 64) * b


def test_kv_cache_gqa_and_mha_sizes():
    # Mistral-7B: 2 x 32 layers x 8 KV heads x 128 = 65,536 elements; Llama-2-7B (MHA) 4x that.
    assert MODELS["mistral-7b"].kv_cache_elements_per_token() == 65_536
    assert MODELS["llama2-7b"].kv_cache_elements_per_token() == 4 * 65_536
    # Falcon-180B: 2 x 80 x 8 x 64
    assert MODELS["falcon-180b"].kv_cache_elements_per_token() == 2 * 80 * 8 * 64


def test_mistral_attention_span_capped_at_window():
    m = get_model("mistral-7b")
    assert m.sliding_window == 4096
    assert m.attention_span(1000) == 1000
    assert m.attention_span(4096) == 4096
    assert m.attention_span(32768) == 4096
    assert m.attention_flops_per_token(32768) == m.attention_flops_per_token(4096)
    assert get_model("llama3-8b").attention_span(32768) == 32768


def test_structural_features_count_what_they_claim():
    # BLOOM: word_embeddings_layernorm adds exactly one LayerNorm (2h)
    bloom = MODELS["bloom-176b"]
    assert bloom.embedding_parameters() == 250880 * 14336 + 3 * 2 * 14336 - 2 * 14336
    # OPT: positions table has max_seq_len + 2 rows
    opt = MODELS["opt-175b"]
    assert opt.embedding_parameters() == 50272 * 12288 + (2048 + 2) * 12288 + 2 * 12288
    # GPT-J: MLP biases (f + h), no attention biases, one LayerNorm per layer; lm_head bias of V
    gptj = MODELS["gpt-j-6b"]
    h, f = 4096, 16384
    assert gptj.layer_parameters(moe=False) == 4 * h * h + 2 * h * f + f + h + 2 * h
    assert gptj.embedding_parameters() == 2 * 50400 * h + 50400 + 2 * h
    # Qwen2.5: QKV biases only
    qwen = MODELS["qwen2.5-72b"]
    assert qwen.attention_parameters() - qwen.attention_weight_parameters() == (64 + 2 * 8) * 128
    # Falcon-180B: parallel block with two LayerNorms
    assert MODELS["falcon-180b"].norms_per_layer == 2
    assert MODELS["gpt-j-6b"].norms_per_layer == 1


def test_inline_unknown_key_rejected_naming_the_key():
    with pytest.raises(ModelCatalogError, match="hidden_size"):
        model_from_mapping({**LLAMA2_7B, "hidden_size": 4096}, "[model]")


def test_inline_heads_kv_heads_mismatch_rejected_naming_the_field():
    with pytest.raises(ModelCatalogError, match="kv_heads"):
        model_from_mapping({**LLAMA2_7B, "kv_heads": 5}, "[model]")


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"layers": 32.0}, "layers"),
        ({"layers": True}, "layers"),
        ({"tied_embeddings": 1}, "tied_embeddings"),
        ({"mlp_bias": "yes"}, "mlp_bias"),
        ({"published_parameters": "7B"}, "published_parameters"),
        ({"activation": "tanh"}, "activation"),
        ({"experts": 8, "experts_per_token": 9, "expert_ffn_hidden": 1024}, "experts_per_token"),
        ({"position_offset": 2}, "position_offset"),
        ({"rotary_dim": 256}, "rotary_dim"),
        ({"norms_per_layer": 3}, "norms_per_layer"),
    ],
)
def test_inline_bad_values_rejected_naming_the_field(override, field):
    with pytest.raises(ModelCatalogError, match=field):
        model_from_mapping({**LLAMA2_7B, **override}, "[model]")


def test_unknown_model_lists_known_names():
    with pytest.raises(ModelCatalogError, match="llama3-70b"):
        get_model("llama-70b")
