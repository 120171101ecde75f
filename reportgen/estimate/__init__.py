"""Analytic estimate of one (model, GPU, setup): memory, time, fit and reverse questions.

``estimate()`` needs no torch. Each term lives in its own module with its formula and source:
``params.py`` (weights, gradients, optimizer states), ``activations.py``, ``logits.py``,
``memory.py`` (the step's timeline and the three totals), ``time.py``, ``search.py`` (and, above this package face, ``cheapest.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.estimate import params as P
from reportgen.estimate.band import Band
from reportgen.fingerprint import estimator_hash
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import MemoryEstimate, estimate_memory
from reportgen.estimate.run import RunEstimate, estimate_run
from reportgen.estimate.search import max_batch, max_seq
from reportgen.estimate.verdict import Verdict, judge
from reportgen.estimate.time import TimeEstimate, estimate_time
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import Recipe, TrainingSetup

@dataclass(frozen=True)
class Estimate:
    model: str
    gpu: str
    setup: TrainingSetup
    params_total: int
    params_trainable: int
    memory: MemoryEstimate
    time: TimeEstimate
    judgement: Verdict  # fits / tight / does not fit, with its margin and band (verdict.py)
    max_batch: int | None  # largest micro-batch whose verdict is "fits" (None: not even 1)
    max_seq: int | None  # longest sequence whose verdict is "fits" (None: not even 128 tokens)
    context_limit: int | None = None  # the model's max_position_embeddings: max_seq never passes it
    notes: list[str] = field(default_factory=list)
    run: RunEstimate | None = None  # the whole run's phases (run.py); the verdict is its deciding phase's
    #: recipe grpo: device bytes and seconds per phase, the phases that decide (``grpo.py``)
    grpo: dict | None = None

    @property
    def verdict(self) -> str:
        """``fits`` | ``tight`` | ``does not fit`` (``verdict.py``)."""
        return self.judgement.kind

    @property
    def fits(self) -> bool:
        """True only for the verdict "fits": the whole error band within the card."""
        return self.judgement.fits

    @property
    def band(self) -> Band | None:
        return self.judgement.band

    @property
    def capacity(self) -> int:
        return self.judgement.capacity

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "setup": self.setup.model_dump(mode="json"),
            "params": {"total": self.params_total, "trainable": self.params_trainable},
            "memory": self.memory.as_dict(),
            "peak_phase": self.memory.peak_phase,
            "time": self.time.as_dict(),
            "fits": self.fits,
            "verdict": self.verdict,
            "demand": self.judgement.demand,
            "margin": self.judgement.margin,
            "verdict_text": self.judgement.text(),
            "verdict_phase": self.judgement.phase,
            "band": None if self.band is None else {
                **self.band.as_dict(), "quantity": "device_total", "demand_range": list(self.judgement.range)},
            "capacity": self.capacity,
            "max_batch": self.max_batch,
            "max_seq": self.max_seq,
            "context_limit": self.context_limit,
            "notes": self.notes,
            "run": None if self.run is None else self.run.as_dict(),
            "estimator_hash": estimator_hash(),
            **({"grpo": self.grpo} if self.grpo is not None else {}),
        }


def estimate(model: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, *, reverse: bool = True,
             train_tokens: int = 100_000_000) -> Estimate:
    """Estimate one case. ``reverse=False`` skips the largest-batch/longest-sequence searches. Recipe
    grpo: ``estimate_grpo`` (a ``SetupError`` for what TRL or vLLM would refuse)."""
    if setup.recipe == Recipe.grpo:
        return estimate_grpo(model, gpu, setup, reverse=reverse, train_tokens=train_tokens)
    mem = estimate_memory(model, setup, gpu)
    t = estimate_time(model, setup, gpu, activation_bytes=mem.terms["activations"],
                      logits_bytes=mem.terms["logits"], train_tokens=train_tokens,
                      offloaded_bytes=mem.offloaded_activations)
    notes = list(dict.fromkeys(mem.notes + t.notes))
    if model.max_position_embeddings and setup.seq > model.max_position_embeddings:
        notes.append(context_note(model, setup.seq))
    if model.vision is not None:
        notes.append(vision_note(model, setup))
    if quantized := quantized_checkpoint_note(model, setup):
        notes.append(quantized)
    if t.peak_dtype in gpu.derived:
        notes.append(f"{gpu.name}: {t.peak_dtype} peak FLOP/s derived by reportgen, not published (GPU catalog)")
    run = estimate_run(model, setup, gpu, dtypes_for(setup), mem)
    deciding = run.phases[run.deciding]
    return Estimate(
        model=model.name, gpu=gpu.key, setup=setup,
        params_total=model.total_params + (model.vision.params if model.vision else 0),
        params_trainable=P.trainable_params(model, setup) + P.vision_lora_params(model, setup)
        + (model.vision.params if model.vision and setup.method.value == "full" else 0),
        memory=mem, time=t, judgement=judge(mem, gpu.memory_bytes, setup.method.value, demand=deciding.gpu_demand,
                                            phase=deciding.name),
        max_batch=max_batch(model, setup, gpu) if reverse else None,
        max_seq=max_seq(model, setup, gpu) if reverse else None,
        context_limit=model.max_position_embeddings or None,
        notes=notes + run.notes, run=run,
    )


def estimate_grpo(model: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, *, reverse: bool = True,
                  train_tokens: int = 100_000_000) -> Estimate:
    """TRL's GRPOTrainer (``grpo.py``): memory and time per phase; the verdict is the phase asking the most
    of the card. The batch and length searches do not apply (a GRPO batch must hold whole prompt groups):
    ``grpo["max_num_generations"]`` answers the reverse question instead."""
    from reportgen.estimate import grpo as G

    G.check(model, setup, gpu)
    judgement, mem, phases, run = G.run_verdict(model, setup, gpu)
    policy = estimate_time(model, setup, gpu, train_tokens=train_tokens, offloaded_bytes=mem.offloaded_activations)
    t, times = G.grpo_time(model, setup, gpu, policy)
    info = {**phases.as_dict(), "times": times["times"], "time_phase": times["dominant"],
            "generation_batch": setup.generation_batch, "prompt_length": setup.prompt_length,
            "max_num_generations": G.max_num_generations(model, setup, gpu) if reverse else None}
    if reverse:
        info["max_completion_length"] = G.max_completion_length(model, setup, gpu)
        info["turn_down"] = G.turn_down(model, setup, gpu, info["max_num_generations"])
    notes = list(dict.fromkeys(mem.notes + t.notes))
    if model.vision is not None:
        notes.append(vision_note(model, setup))
    return Estimate(model=model.name, gpu=gpu.key, setup=setup,
                    params_total=model.total_params + (model.vision.params if model.vision else 0),
                    params_trainable=P.trainable_params(model, setup), memory=mem, time=t, judgement=judgement,
                    max_batch=None, max_seq=None, context_limit=model.max_position_embeddings or None,
                    notes=notes + run.notes, grpo=info, run=run)


def context_note(model: ModelSpec, seq: int) -> str:
    """Why a sequence past the model's context is an extrapolation, naming the RoPE scaling."""
    rope = model.config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
    scaled = f" (including its rope_scaling {kind!r})" if kind else ""
    return (f"seq {seq:,} is past {model.name}'s max_position_embeddings {model.max_position_embeddings:,}{scaled}: "
            "the memory estimate holds, but the model was not trained this long (extrapolation; a RoPE scaling such "
            "as linear, dynamic NTK or YaRN would be needed)")


def quantized_checkpoint_note(model: ModelSpec, setup: TrainingSetup) -> str | None:
    """What a checkpoint saved quantized (config.json's ``quantization_config``: GPTQ, AWQ, bitsandbytes,
    FP8) means for the estimate, which prices the setup named from the model's shapes; None otherwise."""
    q = model.config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    kind = str(q.get("quant_method") or "quantized")
    bits = q.get("bits") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
    what = f"{kind}{f', {bits}-bit' if bits else ''}"
    source = model.name if model.name.endswith(".json") else f"{model.name}'s config.json"
    if setup.method.value == "qlora" and kind == "bitsandbytes" and bits == 4:
        return f"{source} holds a bitsandbytes 4-bit quantization_config: it loads as QLoRA's base, as estimated"
    base = "NF4 base weights by bitsandbytes" if setup.method.value == "qlora" else "16-bit base weights"
    return (f"{source} holds a quantization_config ({what}): that checkpoint loads quantized, which "
            f"this {setup.method.value} estimate ({base})"
            " does not price; transformers trains a quantized checkpoint only through adapters, and not a full "
            "fine-tune: estimate its unquantized base model for a faithful answer")


def vision_note(model: ModelSpec, setup: TrainingSetup) -> str:
    """What a multimodal checkpoint's estimate covers (``params.vision_weights_bytes``)."""
    vis = model.vision
    adapters = P.vision_lora_params(model, setup)
    tower = (f"{model.name} is multimodal: the language model is estimated on text batches; its vision tower and "
             f"projector ({vis.params:,} parameters) are loaded{' (linears 4-bit)' if setup.method.value == 'qlora' else ''}"
             " but do not run, so they add weights only")
    if adapters:
        tower += (f", and peft's target modules also reach the tower's linears: {adapters:,} adapter parameters that "
                  "never get a gradient")
    if vis.kind == "pixtral":  # transformers builds Mistral3ForConditionalGeneration for image-text-to-text only
        tower += "; not checked by a trace (the tracer and the harness build causal-LM classes)"
    return tower + " (images in the batches are not modelled)"


__all__ = ["Estimate", "Verdict", "estimate", "estimator_hash"]
