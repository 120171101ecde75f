"""The analytic estimate of recipes trainer and trl-sft against ``reportgen trace`` running the real
transformers ``Trainer`` / TRL 1.16 ``SFTTrainer`` step on the meta device (``trace/sft.py``), on
Llama 3.1 8B and Qwen3 8B cut to 2 decoder layers (their real widths and vocabularies), within the
3% the plain loop's agreement test allows."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")
pytest.importorskip("trl")

from reportgen.estimate.memory import estimate_memory  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402
from reportgen import catalog  # noqa: E402
from reportgen.trace.agreement import GPU as GPU_KEY, TOLERANCE  # noqa: E402
from reportgen.trace.result import trace_case  # noqa: E402
from reportgen.trace.sft import recipe_dict, recipe_trace  # noqa: E402
from tests.test_trace_agreement import _cut  # noqa: E402

GPU = catalog.load_gpu(GPU_KEY)

#: the estimator's backward of a checkpointed QLoRA layer is too high (+7.7% with peft's preparation,
#: +14.6% without, for the plain loop on Qwen3 8B cut to 2 layers with a 4,096-token vocabulary,
#: batch 2 x 512): the loop's 128k-152k-vocabulary logits make the loss the peak and hide it; TRL's
#: fused head removes that peak, so the recipe shows it (not a term of recipes.py)
QLORA_CKPT_BACKWARD = "QLoRA checkpointed layer backward over-estimated (the loop's logits peak hides it)"
CASES = [("llama", dict(method="lora", grad_ckpt=True)), ("llama", dict(method="qlora", grad_ckpt=True)),
         ("llama", dict(method="full", grad_ckpt=True)), ("qwen3", dict(method="lora")),
         # untied 151,936 x 4,096 head with bf16 weights: peaks at the fused head backward's return (recipes.py
         # trl_head_backward_bytes: the head's gradient in fp32 and bf16 at once; -7.4% without the bf16 copy)
         ("qwen3", dict(method="full", precision="bf16", batch=2)),
         pytest.param("qwen3", dict(method="qlora", grad_ckpt=True, batch=2),
                      marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=QLORA_CKPT_BACKWARD))]


def _trace(spec, setup):
    with recipe_trace(setup):
        trace = trace_case(spec, GPU, setup)
        return trace, recipe_dict(setup, trace.as_dict())


def _id(case) -> str:
    fam, kw = case.values if hasattr(case, "values") else case
    return f"{fam}-{'-'.join(map(str, kw.values()))}"


@pytest.mark.parametrize("fam,kw", CASES, ids=[_id(c) for c in CASES])
def test_trl_sft_estimate_agrees_with_the_traced_sfttrainer(fam, kw):
    spec = _cut(fam)
    setup = TrainingSetup(seq=512, recipe="trl-sft", **kw)
    _, d = _trace(spec, setup)
    names = {e["name"] for e in d["emulations"]}
    assert "trl_compact_tiles" in names and "traced through TRL SFTTrainer" in d["notes"]
    traced = d["memory"]["peak_allocated"]
    gap = estimate_memory(spec, setup, GPU).peak_allocated / traced - 1
    assert abs(gap) <= TOLERANCE, (fam, kw, f"{gap:+.2%}")


def test_sfttrainer_casts_qlora_adapters_to_bf16_and_never_builds_the_logits():
    """What the traced SFTTrainer step holds against the traced plain loop: no fp32 logits
    (TRL's tiles instead), and half the adapters' bytes (sft_trainer.py casts them to bf16)."""
    spec = _cut("llama")
    loop = TrainingSetup(method="qlora", seq=512, kbit_prep="none", grad_ckpt=True)
    _, a = _trace(spec, loop)
    _, b = _trace(spec, loop.model_copy(update={"recipe": "trl-sft"}))
    assert b["memory"]["lora_adapters"] * 2 == a["memory"]["lora_adapters"]
    assert a["peak_phase"] == "loss-backward" and b["peak_phase"] != "loss-backward"
    assert b["memory"]["peak_allocated"] < a["memory"]["peak_allocated"] - 512 * 128_256 * 4


def test_trainer_recipe_traces_like_the_loop():
    """transformers' Trainer (Axolotl's) holds what the loop holds: the same traced peak."""
    spec = _cut("llama")
    loop = TrainingSetup(method="lora", seq=512, grad_ckpt=True)
    _, a = _trace(spec, loop)
    _, b = _trace(spec, loop.model_copy(update={"recipe": "trainer"}))
    assert b["memory"]["peak_allocated"] == a["memory"]["peak_allocated"]
    assert "traced through Trainer" in b["notes"]


def test_a_recipe_trace_has_its_own_hash_and_leaves_the_loops_alone():
    from reportgen.fingerprint import RECIPE_TRACE_SOURCES, TRACE_SOURCES, source_hash, trace_hash

    assert trace_hash("trl-sft") != trace_hash() != trace_hash("trainer")
    # the loop's hash is over the tracer's files without the recipe-only ones
    assert "trace/sft.py" in RECIPE_TRACE_SOURCES["trl-sft"]
    assert trace_hash() != source_hash(TRACE_SOURCES)
    loop = TrainingSetup(method="lora", seq=512)
    _, d = _trace(_cut("llama"), loop.model_copy(update={"recipe": "trl-sft"}))
    assert d["trace_hash"] == trace_hash("trl-sft") and d["environment"]["trl"]
