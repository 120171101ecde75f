"""Issue 34: TRL 1.16's GRPOTrainer on one GPU (``recipe grpo``, ``reportgen/estimate/grpo.py``): the
worked example of each formula, the acceptance command through the CLI (Qwen3-1.7B LoRA, 8
generations of 1,024 tokens on an RTX 4090, with and without vLLM colocated), the combinations TRL or
vLLM refuse (exit 2, one ``error:`` line), and the setups stored before it (their dumps unchanged).

Qwen3-1.7B is not in the catalog and this machine has no network: its config stands in a fixture
Hugging Face cache (as ``tests/test_hub.py`` does for Qwen3-14B), with the shape its model card states
(28 layers, 16 query and 8 key/value heads of 128, hidden 2048, tied embeddings, 1.7B parameters of
which 1.4B are not embeddings; MLP width 6144), checked against the card below.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.estimate import constants as K
from reportgen.estimate import grpo as G
from reportgen.estimate.dtypes import dtypes_for
from reportgen.setup import SetupError, TrainingSetup
from tests.test_hub import put_in_cache

ROOT = Path(__file__).resolve().parents[1]
QWEN3_1_7B = {**json.loads((ROOT / "reportgen/catalog/models/qwen3-8b.json").read_text()),
              "_name_or_path": "Qwen/Qwen3-1.7B", "hidden_size": 2048, "intermediate_size": 6144,
              "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "max_window_layers": 28,
              "tie_word_embeddings": True}
#: the acceptance setup: LoRA, 8 completions of 1,024 tokens after prompts of 512, one prompt per step
ACCEPT = ["--method", "lora", "--recipe", "grpo", "--num-generations", "8", "--max-completion-length", "1024",
          "--max-prompt-length", "512", "--batch", "8", "--grad-ckpt"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3")
    (folder / "config.json").write_text(json.dumps(QWEN3_1_7B))
    return catalog.load_model(str(folder / "config.json"))


@pytest.fixture(scope="module")
def card():
    return catalog.load_gpu("rtx-4090")


def grpo(**kw) -> TrainingSetup:
    values = dict(recipe="grpo", method="lora", grad_ckpt=True, batch=8, max_completion_length=1024,
                  max_prompt_length=512, seq=1536)
    return TrainingSetup(**{**values, **kw})


def test_the_fixture_has_the_model_cards_counts(qwen):
    embeddings = QWEN3_1_7B["vocab_size"] * QWEN3_1_7B["hidden_size"]  # tied head
    assert round(qwen.total_params / 1e9, 1) == 1.7 and round((qwen.total_params - embeddings) / 1e9, 1) == 1.4


# ----- worked examples, one per formula ---------------------------------------------------------------
def test_kv_cache_is_two_layers_kv_heads_head_dim_bytes_per_token(qwen):
    dt = dtypes_for(grpo())
    assert G.kv_token_bytes(qwen, dt) == 2 * 28 * 8 * 128 * 2 == 114_688
    assert G.kv_cache_bytes(qwen, dt, 8, 1536) == 114_688 * 8 * 1536 == 1_409_286_144
    assert G.kv_cat_bytes(qwen, dt, 8, 1536) == 1_409_286_144 // 28 == 50_331_648  # torch.cat: one layer twice
    # full fine-tuning under bf16-mixed keeps fp32 weights: generate (no autocast) caches fp32 keys/values
    assert G.kv_token_bytes(qwen, dtypes_for(grpo(method="full"))) == 2 * 28 * 8 * 128 * 4


def test_decode_logits_are_the_last_positions_copied_to_fp32_and_softmaxed(qwen):
    assert G.decode_logits_bytes(qwen, dtypes_for(grpo()), 8) == 8 * 151_936 * (2 + 4 + 4) == 12_154_880


def test_prefill_holds_one_layers_mlp_and_residual_temporaries(qwen):
    """act(gate), up and their product, a fourth T x I when peft wraps up_proj (its LoRA sum), and four T x H
    tensors (the layer's input, the residual, its norm, the embedding output the model keeps): what the traced
    GRPOTrainer prefill holds (tests/test_trace_grpo.py)."""
    tokens = 8 * 512
    lora = grpo()
    assert G.prefill_working_bytes(qwen, lora, dtypes_for(lora), tokens) == tokens * (4 * 6144 * 2 + 4 * 2048 * 2)
    attention_only = grpo(lora_targets="q_proj,k_proj,v_proj,o_proj")
    assert G.prefill_working_bytes(qwen, attention_only, dtypes_for(attention_only), tokens) == \
        tokens * (3 * 6144 * 2 + 4 * 2048 * 2)


def test_generation_terms_take_the_larger_of_prefill_and_last_decode_step(qwen):
    dt = dtypes_for(grpo())
    terms = G.generation_terms(qwen, grpo(), dt)
    assert terms["kv_cache"] == 1_409_286_144
    prefill = 114_688 * 8 * 512 + 8 * 512 * 65_536 - 1_409_286_144  # negative: the decode end is larger
    assert terms["generation_transient"] == max(prefill, 50_331_648) + 12_154_880
    assert G.generation_terms(qwen, grpo(generation="vllm-colocate", vllm_max_model_length=2048), dt) == {
        "kv_cache": 0, "generation_transient": 0}


def test_vllm_pool_weights_and_kv_room(qwen, card):
    s = grpo(generation="vllm-colocate", vllm_gpu_memory_utilization=0.4)
    assert G.vllm_pool_bytes(s, card) == int(0.4 * 25_757_220_864)
    assert G.vllm_weights_bytes(qwen, s) == qwen.total_params * 2  # bf16, adapters merged into it
    assert G.vllm_kv_token_bytes(qwen) == 114_688
    assert G.vllm_kv_room_tokens(qwen, s, card) == (int(0.4 * 25_757_220_864) - qwen.total_params * 2) // 114_688


def test_scoring_passes_follow_trl(qwen):
    assert G.scoring_passes(grpo()) == (0, 0)  # steps_per_generation = accum, beta 0: no forward before the step
    assert G.scoring_passes(grpo(generation="vllm-colocate")) == (1, 0)  # importance-sampling correction
    assert G.scoring_passes(grpo(generation="vllm-colocate", vllm_importance_sampling_correction=False)) == (0, 0)
    assert G.scoring_passes(grpo(beta=0.04)) == (0, 1)
    assert G.scoring_passes(grpo(accum=2, generation_batch_size=32)) == (1, 0)  # 2 % (32 / 8) != 0


def test_scoring_forward_and_reference_model(qwen):
    s = grpo(beta=0.04)
    dt = dtypes_for(s)
    from reportgen.estimate.recipes import trl_head_memory

    head = trl_head_memory(qwen, s, dt, 8 * 1536).forward_live
    assert G.scoring_transient(qwen, s, dt) == 8 * 1536 * 65_536 + head + 2 * 8 * 1024 * 4
    assert G.ref_model_bytes(qwen, s, dt) == 0  # LoRA: the adapters are disabled instead
    full = grpo(method="full", beta=0.04)
    assert G.ref_model_bytes(qwen, full, dtypes_for(full)) == qwen.total_params * 4  # in the policy's fp32


def test_buffered_generation_batch(qwen):
    assert G.buffered_bytes(grpo()) == 8 * 1536 * 8 * 2
    assert G.buffered_bytes(grpo(generation="vllm-colocate")) == 8 * 1536 * 16 + 8 * 1024 * 4 * 2


def test_the_fused_head_scores_completion_tokens_only(qwen):
    from reportgen.estimate.recipes import trl_scored_tokens

    assert trl_scored_tokens(grpo(), 8 * 1536) == 8 * 1024
    assert trl_scored_tokens(TrainingSetup(recipe="trl-sft", batch=8, seq=1536), 8 * 1536) == 8 * 1536 - 8


def test_phases_add_up_and_name_the_peak(qwen, card):
    mem, ph = G.grpo_memory(qwen, grpo(), card)
    from reportgen.estimate.memory import estimate_memory

    policy = estimate_memory(qwen, grpo(), card)
    t = policy.terms
    resident = t["weights"] + t["quant_constants"] + t["lora_adapters"] + t["optimizer"] + t["cublas_workspace"]
    fixed = K.CUDA_CONTEXT_BYTES + K.ALLOCATOR_SEGMENTS_BYTES
    assert ph.device["generation"] == fixed + resident + ph.terms["kv_cache"] + ph.terms["generation_transient"]
    assert ph.device["policy-step"] == policy.device_total + G.buffered_bytes(grpo())
    assert ph.peak_phase == max(ph.device, key=ph.device.__getitem__)
    assert mem.device_total == ph.device[ph.peak_phase]
    # vLLM colocated without sleep: its pool is there in every phase; with sleep, in generation only
    awake = G.grpo_memory(qwen, grpo(generation="vllm-colocate", vllm_max_model_length=2048), card)[1]
    asleep = G.grpo_memory(qwen, grpo(generation="vllm-colocate", vllm_max_model_length=2048,
                                      vllm_enable_sleep_mode=True), card)[1]
    pool = G.vllm_pool_bytes(grpo(generation="vllm-colocate", vllm_max_model_length=2048), card)
    assert awake.device["policy-step"] - asleep.device["policy-step"] == pool
    assert awake.device["generation"] == asleep.device["generation"]


def test_decode_is_bandwidth_bound_per_step_under_vllm(qwen, card):
    s = grpo(generation="vllm-colocate", vllm_max_model_length=2048)
    dt = dtypes_for(s)
    from reportgen.estimate.memory import effective_attention
    from reportgen.estimate.time import TimeConstants
    from reportgen.estimate.work import Work, layer_work

    c = TimeConstants.current(card, None, "bf16")
    bw = card.memory_bandwidth_gbs * 1e9 * c.dram_efficiency  # decode streams the weights: no L2 reuse
    attn, _ = effective_attention(qwen, s)
    one = layer_work(qwen, s, dt, attn, 8, 1)[0] * 28
    read = qwen.total_params * 2 + 114_688 * 8 * (512 + 1024 / 2)
    decode = 1024 * (read / bw + (one.kernels + 1 + G.SAMPLE_KERNELS) * K.REFERENCE_PROFILE["kernel_device_s"])
    prefill = layer_work(qwen, s, dt, attn, 8, 512)[0] * 28 + Work(kernels=1, matmul_flops=2 * 8 * 2048 * 151_936)
    from reportgen.estimate.time import device_seconds

    expected = device_seconds(prefill, card, "bf16", c, 8 * 512 * 2048 * 2) + decode
    assert math.isclose(G.generation_seconds(qwen, s, card, "bf16", c), expected, rel_tol=1e-12)


def test_transformers_decode_pays_the_hosts_dispatch(qwen, card):
    """HF generate dispatches every kernel from Python each decode step: slower than vLLM's graphs."""
    from reportgen.estimate.time import TimeConstants

    c = TimeConstants.current(card, None, "bf16")
    hf = G.generation_seconds(qwen, grpo(), card, "bf16", c)
    vllm = G.generation_seconds(qwen, grpo(generation="vllm-colocate", vllm_max_model_length=2048), card, "bf16", c)
    assert hf > 3 * vllm


def test_qlora_decode_reads_dequantized_weights(qwen):
    from reportgen.estimate import params as P
    from reportgen.estimate.work import dequant_bytes_per_weight

    s = grpo(method="qlora")
    dt = dtypes_for(s)
    q = P.quantized_linear_params(qwen, s)
    assert G.decode_weight_bytes(qwen, s, dt) == (P.weights_bytes(qwen, s, dt) + P.adapter_bytes(qwen, s, dt)
                                                  + q * (dequant_bytes_per_weight(s) - 0.5 + 2))


def test_step_time_is_the_sum_of_the_phases(qwen, card):
    est = estimate(qwen, card, grpo(), reverse=False)
    times = est.grpo["times"]
    assert math.isclose(est.time.step_s, math.fsum(times.values()))
    assert est.grpo["time_phase"] == "generation"  # decode-bound transformers generate dominates


# ----- the setup: rules and stored ids ----------------------------------------------------------------
def test_default_setups_dump_as_before():
    assert TrainingSetup().model_dump(mode="json") == {
        "method": "full", "precision": "bf16-mixed", "optimizer": "adamw", "lora_rank": 16, "lora_alpha": 32,
        "lora_targets": "all-linear", "lora_dropout": 0.0, "dora": False, "quant": "nf4", "double_quant": False,
        "grad_ckpt": False, "attn": "sdpa", "loss": "standard", "batch": 1, "seq": 2048, "accum": 1,
        "offload": "none", "gpus": 1, "sharding": "none", "padding": "longest", "seq_mean": None,
        "keep_outputs": "none", "optimizer_in_backward": False, "act_offload": False, "quant_head": False,
        "frozen_dtype": "compute", "kbit_prep": None, "compile": False}
    assert TrainingSetup(recipe="trl-sft").model_dump(mode="json")["recipe"] == "trl-sft"
    assert set(grpo().model_dump(mode="json")) >= {"recipe", "max_completion_length", "max_prompt_length"}


def test_stored_case_ids_do_not_move():
    from reportgen.results import case_id

    assert case_id("llama-3.2-1b", "h100-sxm", TrainingSetup().model_dump(mode="json")) == \
        case_id("llama-3.2-1b", "h100-sxm", json.loads(TrainingSetup().model_dump_json()))


@pytest.mark.parametrize("kw, field, words", [
    (dict(batch=4), "num_generations", "must be divisible by num_generations (8)"),
    (dict(batch=8, generation_batch_size=12), "generation_batch_size", "divisible by the global batch size (8)"),
    (dict(num_generations=1), "num_generations", ">= 2"),
    (dict(seq=2048), "seq", "512 + max_completion_length 1024 = 1536"),
    (dict(max_prompt_length=None, seq=1024), "max_completion_length", "leaves no room for a prompt"),
    (dict(loss="fused"), "loss", "fused LM head"),
])
def test_trls_rules_are_setup_errors(kw, field, words):
    with pytest.raises(SetupError) as exc:
        grpo(**kw)
    assert exc.value.field == field and words in exc.value.message


def test_grpo_fields_are_refused_with_other_recipes():
    with pytest.raises(SetupError, match="applies only to recipe grpo"):
        TrainingSetup(num_generations=4)


# ----- the CLI -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    put_in_cache(root, "Qwen/Qwen3-1.7B", QWEN3_1_7B)
    return root


def cli(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "reportgen", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def test_acceptance_without_vllm(hub):
    proc = cli(["estimate", "--model", "Qwen/Qwen3-1.7B", "--gpu", "rtx-4090", *ACCEPT, "--format", "json"], hub)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    g = out["grpo"]
    assert set(g["phases"]) == {"generation", "policy-step"} and g["peak_phase"] in g["phases"]
    assert g["time_phase"] == "generation" and out["verdict"] == "fits"
    assert g["generation_batch"] == 8 and g["prompt_length"] == 512 and g["max_num_generations"] >= 8
    table = cli(["estimate", "--model", "Qwen/Qwen3-1.7B", "--gpu", "rtx-4090", *ACCEPT], hub)
    assert table.returncode == 0, table.stderr
    assert "GRPO phases" in table.stdout and "decides the verdict" in table.stdout
    assert "largest num_generations that fits" in table.stdout


def test_acceptance_with_vllm_colocated(hub):
    """TRL's default utilization (0.3 of 24 GiB) cannot hold Qwen3-1.7B's weights and one sequence of its
    40,960-token context: vLLM would not start, and the error names both ways out; either one fits."""
    base = ["estimate", "--model", "Qwen/Qwen3-1.7B", "--gpu", "rtx-4090", *ACCEPT, "--generation", "vllm-colocate"]
    refused = cli(base, hub)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "vllm_gpu_memory_utilization to 0.32" in refused.stderr.replace("\n", " ")
    for extra in (["--vllm-max-model-length", "2048"], ["--vllm-gpu-memory-utilization", "0.4"]):
        proc = cli([*base, *extra, "--format", "json"], hub)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["grpo"]["terms"]["vllm_pool"] > 0 and out["grpo"]["terms"]["kv_cache"] == 0
        assert "scoring" in out["grpo"]["phases"]  # TRL's importance-sampling correction re-scores


@pytest.mark.parametrize("extra, words", [
    (["--batch", "4"], "divisible by num_generations"),
    (["--batch", "4"], "e.g. batch 8 (GRPOConfig's default per_device_train_batch_size is 8), accum 2"),
    (["--max-completion-length", "40960", "--max-prompt-length", "512"], "past"),
    (["--generation", "vllm-colocate", "--vllm-gpu-memory-utilization", "0.9"], "does not fit"),
    (["--num-generations", "1"], ">= 2"),
    (["--generation", "vllm-colocate", "--vllm-max-model-length", "64"], "64 is shorter than seq"),
])
def test_bad_combinations_exit_2_with_one_error_line(hub, extra, words):
    args = ["estimate", "--model", "Qwen/Qwen3-1.7B", "--gpu", "rtx-4090", *ACCEPT, *extra]
    proc = cli(args, hub)
    if words == "does not fit":  # a verdict, not an error: vLLM's share leaves training too little
        assert proc.returncode == 0, proc.stderr
        assert "does not fit" in proc.stdout and "vLLM's pool" in proc.stdout
        return
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and words in proc.stderr.replace("\n", " ")


# ----- --from a trl grpo config ---------------------------------------------------------------------------
def test_a_grpo_config_accounts_for_every_key(hub):
    proc = cli(["estimate", "--from", "tests/fixtures/configs/trl_grpo.yaml", "--gpu", "rtx-4090", "--format",
                "json"], hub)
    assert proc.returncode == 0, proc.stderr
    setup = json.loads(proc.stdout)["setup"]
    assert setup["recipe"] == "grpo" and setup["generation"] == "vllm-colocate" and "num_generations" not in setup  # 8, the default
    assert setup["max_completion_length"] == 1024 and setup["seq"] == 512 + 1024
    assert setup["vllm_gpu_memory_utilization"] == 0.4 and setup["vllm_enable_sleep_mode"] is True
    report = proc.stderr.replace("\n", " ")
    keys = [ln.split(":")[0] for ln in (ROOT / "tests/fixtures/configs/trl_grpo.yaml").read_text().splitlines()
            if ln and not ln.startswith("#")]
    for key in keys:  # every key honoured, approximated, not modelled or ignored, by name
        assert key in report, key
    assert "prompts taken as 512 tokens" in report and "reward_funcs" in report
    assert "unknown" not in report


def test_a_grpo_config_beside_flags(hub, tmp_path):
    proc = cli(["estimate", "--from", "tests/fixtures/configs/trl_grpo.yaml", "--gpu", "rtx-4090",
                "--max-prompt-length", "256", "--generation", "hf", "--format", "json"], hub)
    assert proc.returncode == 0, proc.stderr
    setup = json.loads(proc.stdout)["setup"]
    assert setup["seq"] == 256 + 1024 and "generation" not in setup  # hf, the default
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "tests/fixtures/configs/trl_grpo.yaml").read_text().replace(
        "per_device_train_batch_size: 8", "per_device_train_batch_size: 6"))
    proc = cli(["estimate", "--from", str(bad), "--gpu", "rtx-4090"], hub)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "divisible by num_generations (8)" in proc.stderr.replace("\n", " ")


def test_the_verdict_names_generation_when_it_asks_the_most():
    """vLLM asleep outside generation but holding 95 % of the card while it generates: generation decides,
    and the verdict's sentence says so (verdict.PHASE_WORDS); a policy step that decides reads as training's."""
    m, g = catalog.load_model("llama-3.2-1b"), catalog.load_gpu("rtx-4090")
    s = TrainingSetup(recipe="grpo", method="lora", grad_ckpt=True, batch=8, generation="vllm-colocate",
                      vllm_gpu_memory_utilization=0.95, vllm_enable_sleep_mode=True, vllm_max_model_length=2048)
    e = estimate(m, g, s, reverse=False)
    assert e.grpo["peak_phase"] == "generation" and e.judgement.phase == "generation"
    assert e.judgement.text().startswith("does not fit: needs ") and " GiB at generation, short by " in e.judgement.text()
    plain = estimate(m, g, s.model_copy(update={"generation": "hf", "vllm_enable_sleep_mode": False,
                                                "vllm_max_model_length": None}), reverse=False)
    assert plain.grpo["peak_phase"] == "policy-step" and plain.judgement.phase == "train"


def test_a_grpo_run_has_its_load_evaluation_and_save_phases_and_the_largest_decides():
    """The whole run (run.py) around a GRPO step: load, the step, evaluation and the adapter's save, each with its
    demand; 256 evaluation samples generating 4,096 tokens hold a KV cache larger than the step, so evaluation
    decides and the verdict says so; without evaluation the step does."""
    m, g = catalog.load_model("llama-3.2-1b"), catalog.load_gpu("h100-sxm")
    s = TrainingSetup(recipe="grpo", method="lora", batch=8, save="adapter")
    step = estimate(m, g, s, reverse=False)
    assert set(step.run.phases) == {"load", "train", "save"} and step.run.deciding == "train"
    assert step.run.phases["train"].gpu_demand == step.memory.card_demand
    assert step.run.phases["save"].host_terms["adapter_copy"] > 0
    ev = estimate(m, g, s.model_copy(update={"eval_batch": 256, "eval_generate": 4096}), reverse=False)
    assert ev.run.deciding == "eval" and ev.judgement.phase == "eval"
    assert ev.judgement.demand == ev.run.phases["eval"].gpu_demand > step.memory.card_demand
    assert " GiB at evaluation" in ev.judgement.text()


@pytest.mark.parametrize("command", [["trace", "--generation", "vllm-colocate"], ["measure", "--device", "cpu"]])
def test_a_grpo_step_is_never_traced_or_measured_as_an_sft_step(command, capsys):
    """The harness runs SFT steps and the tracer runs TRL's GRPOTrainer step with transformers' generate only
    (``tests/test_trace_grpo.py``): recipe grpo is refused before anything runs by the harness, and by the tracer
    with vLLM generation, so no SFT figure is ever stored or shown as GRPO's."""
    from reportgen.cli import main

    assert main([*command[:1], "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--recipe", "grpo", "--method", "lora",
                 "--batch", "8", *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "recipe grpo" in err and "Traceback" not in err


def test_what_to_turn_down_first_each_alone_fits():
    """Issue 34: a GRPO step that does not fit names the changes that make it fit, each alone: fewer
    completions per prompt, shorter completions (a multiple of 64 tokens, the GRPO counterpart of the
    longest sequence), a smaller vLLM share; a step that fits names none, and its longest completion is its own."""
    from reportgen.estimate import grpo as G

    m, g = catalog.load_model("llama-3.2-1b"), catalog.load_gpu("rtx-4090")
    big = TrainingSetup(recipe="grpo", method="lora", batch=16, num_generations=16, max_completion_length=8192,
                        seq=8704)
    e = estimate(m, g, big)
    assert e.verdict == "does not fit" and e.grpo["turn_down"]
    for change in e.grpo["turn_down"]:
        s = (G.with_generations(big, change["value"]) if change["field"] == "num_generations" else
             G.with_completion(big, change["value"]) if change["field"] == "max_completion_length" else
             big.model_copy(update={change["field"]: change["value"]}))
        assert estimate(m, g, s, reverse=False).verdict == "fits", change
    c = e.grpo["max_completion_length"]
    assert c % G.COMPLETION_STEP == 0 and c < 8192
    assert estimate(m, g, G.with_completion(big, c + G.COMPLETION_STEP), reverse=False).verdict != "fits"
    vllm = TrainingSetup(recipe="grpo", method="lora", batch=8, grad_ckpt=True, generation="vllm-colocate",
                         vllm_gpu_memory_utilization=0.9, vllm_max_model_length=2048)
    shares = [x for x in estimate(m, g, vllm).grpo["turn_down"] if x["field"] == "vllm_gpu_memory_utilization"]
    assert shares and shares[0]["value"] < 0.9
    small = estimate(m, g, TrainingSetup(recipe="grpo", method="lora", batch=8, grad_ckpt=True))
    assert small.verdict == "fits" and small.grpo["turn_down"] == []
    assert small.grpo["max_completion_length"] == small.setup.max_completion_length


def test_advise_on_a_grpo_config_answers_for_the_grpo_step_not_an_sft_walk(tmp_path, capsys):
    """The decision tree walks SFT steps: for a trl grpo config, advise gives the GRPO step's own answer
    (phases, largest num_generations and completion, what to turn down) instead of recommending an SFT setup."""
    from reportgen.cli import main

    text = (Path(__file__).parent / "fixtures" / "configs" / "trl_grpo.yaml").read_text()
    path = tmp_path / "grpo.yaml"
    path.write_text(text.replace("Qwen/Qwen3-1.7B", "meta-llama/Llama-3.2-1B"))
    assert main(["advise", "--from", str(path), "--gpu", "rtx-4090", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["recipe"] == "grpo" and d["setup"]["recipe"] == "grpo" and "turn_down" in d["grpo"]
    assert "steps" not in d and "recommended" not in d  # no SFT walk
    assert main(["advise", "--from", str(path), "--gpu", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recipe grpo: the decision tree walks SFT steps") and "GRPO phases" in out


def test_the_reverse_answers_judge_the_whole_run_and_evaluation_keeps_its_own_batch_rule():
    """``max_num_generations`` and ``max_completion_length`` are judged as the verdict is (``grpo.run_verdict``):
    when evaluation alone does not fit, no number of completions makes the run fit, so none is offered. The
    evaluation micro-batch follows TRL's own rule (GRPOConfig: the global eval batch divisible by
    num_generations), not the training batch's generation-batch rule, which refused a valid run."""
    from reportgen.setup import SetupError

    m, g = catalog.load_model("llama-3.2-1b"), catalog.load_gpu("h100-sxm")
    s = TrainingSetup(recipe="grpo", method="lora", batch=8, max_completion_length=256)
    assert estimate(m, g, s).grpo["max_num_generations"] == 384  # the step alone decides
    ev = estimate(m, g, s.model_copy(update={"eval_batch": 256, "eval_generate": 4096}))
    assert not ev.judgement.fits and ev.judgement.phase == "eval"
    assert ev.grpo["max_num_generations"] is None and ev.grpo["max_completion_length"] is None
    assert not any(t["field"] == "num_generations" for t in ev.grpo["turn_down"])
    ok = estimate(m, g, s.model_copy(update={"generation_batch_size": 16, "eval_batch": 64}), reverse=False)
    assert ok.judgement.fits and ok.run.phases["eval"].gpu_demand > 0
    with pytest.raises(SetupError, match="global eval batch \\(6 x 1 GPU\\) must be divisible by num_generations"):
        s.model_copy(update={"eval_batch": 6})
