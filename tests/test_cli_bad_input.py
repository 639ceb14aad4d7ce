"""Each crash class the new-user fuzzing of issue 12 found, from the CLI: one ``error:`` line naming
the field (exit 2), or a result with strict JSON; never a traceback, never a hang."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ROOT / "examples" / "train-zb-h1.toml"
SERVING = ROOT / "examples" / "llama3-70b-h100-serving.toml"
TRACE = ROOT / "examples" / "serve-azure-conv-trace-a100.toml"

INLINE = """
[model]
layers = 4
hidden = 1024
heads = 16
kv_heads = 16
ffn_hidden = 4096
vocab = 32000
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = 1
[training]
seq_len = 1024
global_batch = 4
"""


def error_of(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def serving_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, serving: str, *, model: str = "llama3-8b",
                  gpu: str = "h100-sxm-80gb", num_gpus: int = 1) -> str:
    """The ``error:`` line, its whole stderr, of ``llmsim simulate`` (exit 2) on a tiny offline serving
    run whose [serving] table holds the TOML lines ``serving``."""
    path = tmp_path / "serve.toml"
    path.write_text(f'[model]\nname = "{model}"\n[cluster]\ngpu = "{gpu}"\nnum_gpus = {num_gpus}\n'
                    f'[serving]\n{serving}\n'
                    '[workload]\narrival = "offline"\nnum_requests = 2\nprompt_tokens = 64\noutput_tokens = 4\n')
    code = main(["simulate", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture()
def inline(tmp_path: Path) -> Path:
    path = tmp_path / "inline.toml"
    path.write_text(INLINE)
    return path


# ---- files that are not UTF-8 or not well formed ----------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1"])
def test_config_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str], encoding: str) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(INLINE.replace('name = ', 'name = ').replace("[model]", '[model]\nnotes = "caf\u00e9"').encode(encoding))
    assert "is not UTF-8 text" in error_of(capsys, "simulate", path)


def test_config_path_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a folder, not a TOML file" in error_of(capsys, "simulate", tmp_path)


def test_deeply_nested_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nests tables or arrays too deeply" in error_of(capsys, "simulate", path)


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("latin.csv", b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,1\xe90,5\n", "is not UTF-8 text"),
        ("nan.csv", b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\nnan,10,5\n", "line 3: timestamp 'nan' must be a finite"),
        ("abc.jsonl", b'{"timestamp": 0, "input_length": "abc", "output_length": 3}\n', "line 1: input_length 'abc' is not a number"),
        ("inf.jsonl", b'{"timestamp": 0, "input_length": Infinity, "output_length": 3}\n', "line 1: input_length inf must be a finite"),
    ],
)
def test_malformed_traces_name_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                              content: bytes, fragment: str) -> None:
    trace = tmp_path / name
    trace.write_bytes(content)
    line = error_of(capsys, "simulate", TRACE, "--set", f"workload.trace='{trace}'")
    assert f"workload.trace = '{trace}'" in line and fragment in line


def test_trace_path_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a folder" in error_of(capsys, "simulate", TRACE, "--set", f"workload.trace='{tmp_path}'")


def test_empirical_lengths_from_a_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "lengths.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    value = f"{{distribution='empirical', path='{binary}', column='x'}}"
    line = error_of(capsys, "simulate", SERVING, "--set", f"workload.prompt_tokens={value}")
    assert "workload.prompt_tokens" in line and "not UTF-8" in line


# ---- non-finite and absurd numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, fragment",
    [
        ("parallel.overlap_slowdown=inf", "[parallel] overlap_slowdown = inf must be a finite number"),
        ("parallel.overlap_slowdown=nan", "[parallel] overlap_slowdown = nan must be a finite number"),
        ("parallel.expert_load_imbalance=nan", "[parallel] expert_load_imbalance = nan"),
        ("parallel.expert_load_imbalance=1e300", "[parallel] expert_load_imbalance = 1e+300"),
        ("training.global_batch=1099511627776", "[training] global_batch = 1099511627776 is past the limit 16,777,216"),
        ("cluster.num_gpus=1099511627776", "[cluster] num_gpus = 1099511627776 is past the limit 1,000,000"),
        # stack settings: allowed values, finite numbers
        ("training.fsdp_unit=block", "[training] fsdp_unit = 'block'; allowed: layer, chunk"),
        ("training.param_gather_pacing=eager", "[training] param_gather_pacing = 'eager'; allowed: bucket, free"),
        ("training.fp8_bf16_edge_layers=nan", "[training] fp8_bf16_edge_layers = nan must be a finite number >= 0"),
        ("training.fp8_bf16_edge_layers=inf", "[training] fp8_bf16_edge_layers = inf must be a finite number >= 0"),
        ("training.host_forward_op_us=inf", "[training] host_forward_op_us = inf must be a finite number >= 0"),
        ("training.host_backward_op_us=nan", "[training] host_backward_op_us = nan must be a finite number >= 0"),
    ],
)
def test_training_numbers(capsys: pytest.CaptureFixture[str], assignment: str, fragment: str) -> None:
    assert fragment in error_of(capsys, "simulate", TRAINING, "--fidelity", "analytic", "--set", assignment)


@pytest.mark.parametrize(
    "assignment, fragment",
    [
        ("workload.output_tokens=1000000", "workload.output_tokens reaches 1,000,000 tokens, past the limit of 131,072"),
        ("workload.num_requests=1099511627776", "workload.num_requests = 1,099,511,627,776 is past the limit of 200,000"),
        ("workload.prompt_tokens={distribution='zipf', exponent=1.1, min=1, max=1099511627776}", "past the limit 10,000,000"),
        ("workload.prompt_tokens={distribution='zipf', exponent=1.1, min=1, max=5000000}", "past the limit of 1,000,000"),
        ("workload.prompt_tokens={distribution='lognormal', mu=1000.0, sigma=1.0}", "workload.prompt_tokens: mu = 1000.0 must be a finite"),
        ("workload.rate_per_s=nan", "workload.rate_per_s = nan must be a finite number"),
        ("workload.burstiness=inf", "workload.burstiness = inf must be a finite number"),
        ("slo.ttft_s=inf", "slo.ttft_s = inf must be a finite number"),
        # what is allowed, per field (not every dtype of the catalog)
        ("serving.kv_precision='fp4'", "serving.kv_precision = 'fp4'; allowed: bf16, fp16, fp8, int4"),
        ("serving.weight_precision='fp4'", "serving.weight_precision = 'fp4'; allowed: bf16, fp16, fp8, int8, int4"),
        ("workload.sessions={turns=0, think_time_s=1.0}", "workload.sessions.turns = 0 must be in [1, 10,000,000]"),
    ],
)
def test_serving_numbers(capsys: pytest.CaptureFixture[str], assignment: str, fragment: str) -> None:
    assert fragment in error_of(capsys, "simulate", SERVING, "--set", assignment)


def test_lognormal_with_mu_runs_without_overflow(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", str(SERVING), "--set", "workload.num_requests=5", "--format", "json",
                 "--set", "workload.prompt_tokens={distribution='lognormal', mu=6.0, sigma=0.5}"])
    captured = capsys.readouterr()
    assert code == 0 and "RuntimeWarning" not in captured.err and json.loads(captured.out)["completed"] == 5


@pytest.mark.parametrize(
    "assignment, fragment",
    [
        ("model.experts=-1", "experts = -1 must be >= 0"),
        ("model.q_lora_rank=-1", "q_lora_rank = -1 must be >= 0"),
        ("model.head_dim=-1", "head_dim = -1 must be >= 0"),
        ("model.shared_experts=-1", "shared_experts = -1 must be >= 0"),
        ("model.layers=1000000000", "layers = 1000000000 is past the limit 100,000"),
    ],
)
def test_inline_model_fields(inline: Path, capsys: pytest.CaptureFixture[str], assignment: str, fragment: str) -> None:
    assert fragment in error_of(capsys, "simulate", inline, "--set", assignment)


def test_inline_model_without_its_required_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text(INLINE.replace("kv_heads = 16\n", "").replace("ffn_hidden = 4096\n", ""))
    assert "error: [model]: missing keys 'kv_heads', 'ffn_hidden'" == error_of(capsys, "simulate", path)


def test_model_name_of_the_wrong_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert "[model] name = 1 must be a string" in error_of(capsys, "simulate", TRAINING, "--set", "model.name=1")


# ---- hangs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fidelity", ["des", "analytic"])
def test_huge_batch_is_refused_with_the_limit(capsys: pytest.CaptureFixture[str], fidelity: str) -> None:
    line = error_of(capsys, "simulate", TRAINING, "--set", "training.global_batch=1048576", "--fidelity", fidelity)
    assert "scheduled passes, past the limit of 131,072" in line and "training.micro_batch" in line


def test_outputs_past_the_context_warn(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", str(SERVING), "--set", "workload.num_requests=2", "--set", "workload.output_tokens=9000",
                 "--set", "workload.prompt_tokens=100", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0 and "2 of 2 requests have prompt + output tokens past the 8192-token context" in captured.err


def test_seed_negative_in_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert "workload.seed = -1 must be >= 0" in error_of(capsys, "simulate", SERVING, "--set", "workload.seed=-1")


# ---- stack settings, measurement files and key order (fuzzing, round 2) --------------------------------


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("step_overhead_us = nan", "[serving] step_overhead_us = nan must be a finite number >= 0"),
        ("request_overhead_us = inf", "[serving] request_overhead_us = inf must be a finite number >= 0"),
        ("runtime_reserve_MiB = nan", "[serving] runtime_reserve_MiB = nan must be a finite number >= 0"),
        ("custom_all_reduce_max_bytes = inf", "[serving] custom_all_reduce_max_bytes = inf must be a finite number >= 0"),
        ("api_server_token_overhead_us = nan", "[serving] api_server_token_overhead_us = nan must be a finite number >= 0"),
    ],
)
def test_serving_stack_settings_not_finite(capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str,
                                           fragment: str) -> None:
    assert fragment in serving_error(capsys, tmp_path, line)


@pytest.mark.parametrize("line, fragment", [("", "[training] needs 'seq_len'"),
                                            ("seq_lens = 1024\n", "[training] unknown key 'seq_lens'; allowed: seq_len, ")])
def test_training_keys_checked_before_the_inline_model(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                                       fragment: str) -> None:
    """An inline model's max_seq_len defaults to seq_len: a missing or misspelled seq_len is named as
    such, not as "[model]: missing key 'max_seq_len'"."""
    path = tmp_path / "c.toml"
    path.write_text(INLINE.replace("seq_len = 1024\n", line))
    assert fragment in error_of(capsys, "simulate", path)


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "is a folder, not a CSV file"),
        ("op,precision,m,n,k,latency_s\ngemm,bf16,1024,1024,1024,1e-4\ngemm,bf16,abc,1024,1024,2e-4\n",
         "m = 'abc' on data row 2 is not an integer"),
        ("op,precision,m,n,k,latency_s\ngemm,bf16,1024.5,1024,1024,1e-4\n", "m = '1024.5' on data row 1 is not an integer"),
        ("op,precision,m,n,k,latency_s\ngemm,bf16,1024,1024,1024,fast\n", "latency_s = 'fast' on data row 1 is not a number"),
        ("op,precision,m,n,k,latency_s\ngemm,bf16,1024,1024,1024,inf\n", "latency_s must be > 0 and finite on every row"),
    ],
)
def test_malformed_measurement_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
                                     fragment: str) -> None:
    path = tmp_path / "m.csv"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    line = error_of(capsys, "validate", "--measurements", path)
    assert line.startswith(f"error: measurements file '{path}'") and fragment in line


def test_disaggregated_table_with_another_scheduler_warns(capsys: pytest.CaptureFixture[str]) -> None:
    """Not an error: the disaggregated example is meant to be rerun colocated with --set serving.scheduler."""
    example = ROOT / "examples" / "serve-disaggregated-h100.toml"
    code = main(["simulate", str(example), "--set", "workload.num_requests=5", "--set", "serving.scheduler='vllm'",
                 "--set", "serving.replicas=4", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["completed"] == 5
    assert ("warning: [serving.disaggregated] is ignored: serving.scheduler = 'vllm' (the table applies to "
            "scheduler = 'disaggregated' only)") in captured.err.splitlines()


def test_trace_with_a_synthetic_arrival(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_of(capsys, "simulate", TRACE, "--set", "workload.arrival='poisson'", "--set", "workload.rate_per_s=1.0")
    assert line == ("error: workload.trace applies to arrival = 'trace' only, not 'poisson'; "
                    "set arrival = 'trace' to replay it")


def test_catalog_model_with_extra_keys_says_why_keys_are_missing(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_of(capsys, "simulate", TRAINING, "--set", "model.max_seq_len=4096")
    assert line.startswith("error: [model]: missing keys 'layers', 'hidden',") and line.endswith(
        "(name = 'llama2-7b' is a catalog model: give the name alone to use it; with other keys (max_seq_len) "
        "[model] is a whole inline architecture)")


@pytest.mark.parametrize("fidelity", ["des", "analytic"])
def test_huge_virtual_stages_is_refused_before_placing_chunks(capsys: pytest.CaptureFixture[str], fidelity: str) -> None:
    """The schedule's placement walks every model chunk: 10^18 of them hung before the pass limit was checked."""
    line = error_of(capsys, "simulate", TRAINING, "--set", "parallel.schedule='interleaved'",
                    "--set", "parallel.virtual_stages=1000000000000000000", "--fidelity", fidelity)
    assert "virtual_stages 1000000000000000000 = 8,000,000,000,000,000,000 model chunks, past the limit of 131,072" in line


def test_unknown_catalog_model_names_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_of(capsys, "simulate", TRAINING, "--set", "model.name='llama3-8bb'")
    assert line.startswith("error: [model] name: unknown model 'llama3-8bb'; known: bloom-176b, ")


@pytest.mark.parametrize(
    "options, fragment",
    [
        (["--holdout", "0.5", "--seed", "-1"], "error: --seed -1: must be >= 0 (it seeds the holdout split)"),
        (["--max-median-error", "-1"], "error: --max-median-error -1.0: must be a finite fraction >= 0 (0.1 = 10 %)"),
        (["--max-median-error", "nan"], "error: --max-median-error nan: must be a finite fraction >= 0 (0.1 = 10 %)"),
    ],
)
def test_measurement_report_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str],
                                    fragment: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text("op,precision,m,n,k,latency_s\ngemm,bf16,1024,1024,1024,1e-4\ngemm,bf16,2048,1024,1024,2e-4\n")
    assert error_of(capsys, "validate", "--measurements", path, "--gpu", "h100-sxm-80gb", *options) == fragment


@pytest.mark.parametrize(
    "argv, name",
    [
        (["calibrate", "fit", "m.csv", "--gpu", "h100-sxm-80gb"], "profile.toml"),
        (["calibrate", "import", "aiconfigurator", "."], "measurements.csv"),
        (["calibrate", "run", "--device", "cpu", "--quick"], "measurements.csv"),
    ],
)
def test_calibrate_out_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                        name: str) -> None:
    line = error_of(capsys, *argv, "--out", tmp_path)
    assert line == f"error: --out '{tmp_path}' is a folder; give a file name such as '{tmp_path / name}'"


SEARCH_TRAINING = ROOT / "examples" / "search-gpt3-1t-a100.toml"
SEARCH_FLEET = ROOT / "examples" / "search-fleet-llama3-70b.toml"


@pytest.mark.parametrize(
    "config, assignment, fragment",
    [
        (SEARCH_TRAINING, "search.goal=['fleet']", "[search] goal = ['fleet'] must be one of training, fleet, offload"),
        (SEARCH_FLEET, "search.goal={}", "[search] goal = {} must be one of training, fleet, offload"),
        (SEARCH_TRAINING, "search.cp=[0]", "[search] cp = [0]: 0 is not allowed; each value must be >= 1"),
        (SEARCH_TRAINING, "search.tp=[-2, 4]", "[search] tp = [-2, 4]: -2 is not allowed; each value must be >= 1"),
        (SEARCH_TRAINING, "search.zero=[1, 5]", "[search] zero = [1, 5]: 5 is not allowed; each value must be in 0, 1, 2, 3"),
        (SEARCH_TRAINING, "search.train_tokens=nan", "[search] train_tokens = nan must be a positive finite number"),
        (SEARCH_TRAINING, "search.budget_per_hour=inf", "[search] budget_per_hour = inf must be a positive finite number"),
        (SEARCH_FLEET, "search.target_rate_per_s=inf", "search.target_rate_per_s = inf must be a positive finite number"),
    ],
)
def test_search_table_values(capsys: pytest.CaptureFixture[str], config: Path, assignment: str, fragment: str) -> None:
    """Each of these was a traceback (an unhashable goal; cp = 0 a ZeroDivisionError) or was accepted and
    the search ran with it (nan / inf train_tokens, an infinite target rate)."""
    assert fragment in error_of(capsys, "search", config, "--workers", "1", "--set", assignment)


def test_a_kv_precision_the_gpu_lacks_is_an_error_when_given(capsys: pytest.CaptureFixture[str]) -> None:
    """As a weight precision: an explicit bf16 KV cache on a V100 is refused; left to the default it
    becomes fp16."""
    message = error_of(capsys, "simulate", SERVING, "--set", 'cluster.gpu="v100-sxm-32gb"', "--set", 'cluster.node="dgx-1-v100"',
                       "--set", 'serving.weight_precision="fp16"', "--set", 'serving.kv_precision="bf16"')
    assert "serving.kv_precision = 'bf16': gpu v100-sxm-32gb has no bf16 peak" in message


def test_search_names_its_own_section_for_an_unknown_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "search.toml"
    config.write_text(INLINE + '[search]\ngpus = ["h900"]\n')
    assert "[search] gpus: unknown gpu 'h900'; known: a100-pcie-80gb" in error_of(capsys, "search", config)


def test_sweep_json_gives_the_values_as_applied(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", str(TRAINING), "--fidelity", "analytic", "--sweep", "parallel.pp=1,2", "--format", "json"])
    assert code == 0
    assert [run["value"] for run in json.loads(capsys.readouterr().out)["runs"]] == [1, 2]
