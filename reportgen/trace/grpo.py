"""``reportgen trace --recipe grpo``: TRL 1.16's own ``GRPOTrainer`` step (``measure/grpo.py``) on the meta
device, under the tracer's recorder and caching-allocator replay, for generation ``hf``.

Kept apart from the loop's tracer (``fingerprint.RECIPE_TRACE_SOURCES["grpo"]``). ``grpo_trace(setup)`` is
entered around ``trace_case`` as ``sft.recipe_trace`` is, and hands ``run_trace`` the trainer through the
functions it imports when it runs: ``measure.build.build`` (the policy, and for ``beta > 0`` with full
fine-tuning the reference model), ``measure.optimizers.make_optimizer`` (``Trainer.create_optimizer``),
``trace.step.register_model`` (the reference model's tensors are allocations too) and
``measure.step.train_step``, replaced by ``grpo_step``: ``accum`` times TRL's ``training_step`` (its
``_prepare_inputs`` generates and scores the generation batch at the first micro-batch, then
``compute_loss`` and ``accelerator.backward``), then ``optimizer.step()`` and ``zero_grad(set_to_none)``
as Trainer's loop does. Every traced step starts a generation window (TRL's ``_step`` set to 0), so the
measured step is one that generates.

Phases of the measured step: ``generation`` (``_generate``: tokenizing, transformers' ``generate``, the
completions' decoding and metrics), ``scoring`` (the rest of ``_generate_and_score_completions``: the
padded tensors, the old and reference log-probs when TRL computes them, rewards and advantages, and
``_prepare_inputs``' shuffle and split into the buffer), then the policy step's phases as the loop's
(``forward`` ... ``zero-grad``). The work counter (the traced step's time) counts the policy step alone.
The harness's autocast (mixed precision) is entered around ``compute_loss`` only, as Trainer's
``compute_loss_context_manager``; generation and scoring run without it, as ``estimate/grpo.py`` assumes (a
run whose model accelerate prepares under ``bf16`` would autocast them too: the issue's cases are pure bf16).

Emulations (what a CUDA run does that meta cannot, and how each is stood in for):

* ``fixed_length_generation``: every completion runs ``max_completion_length`` tokens with no EOS.
  transformers' decoding loop stops when ``StopCheck`` reads ``unfinished_sequences.max() == 0`` from
  the device (``generation/utils.py`` ``StopCheck.__call__``); here it answers "stop" exactly when the
  sequences reach ``prompt + max_completion_length`` tokens. Sampling (``softmax``, ``multinomial``), the
  cache's growth and every forward run as transformers wrote them.
* ``completion_ids_on_host``: TRL's ``_generate_single_turn`` (hf path) reads the generated ids back to
  the host (``completion_ids.cpu()``, ``.tolist()``) and cuts each at its first EOS; here it is replaced
  by the same steps on meta tensors (the prompt ids to the device, ``unwrap_model_for_generation``,
  ``torch.no_grad()``, ``generate`` with the trainer's generation config) and returns every completion
  as ``max_completion_length`` tokens, none of them EOS. The EOS search's small ``G x C`` masks are left out.
* ``host_reads_of_meta``: ``.tolist()`` / ``.cpu()`` of a meta tensor (TRL's logged rewards and
  advantages) yield zeros on the host; ``.item()`` and ``nonzero`` as ``trace/sft.py``'s
  ``data_dependent_scalars`` (every mask element valid).
* ``meta_device_accelerator``: the trainer's ``accelerator.device`` is meta, so TRL's tensors of the
  generation batch are made where the model is (on CUDA: the GPU).
* ``trl_compact_tiles``: TRL's fused LM head on its CUDA path, as ``trace/sft.py``.
"""

from __future__ import annotations

import contextlib

from reportgen.errors import UserError
from reportgen.setup import Method, Recipe, TrainingSetup
from reportgen.trace.emulations import EMULATIONS, Emulation

for _e in (Emulation("fixed_length_generation", "transformers' generate runs max_completion_length decode steps: "
                     "its stop check (unfinished_sequences.max() == 0, a device read) answers stop at prompt + "
                     "max_completion_length tokens, no EOS", "transformers/generation/utils.py StopCheck.__call__"),
           Emulation("completion_ids_on_host", "TRL's hf generation path on meta tensors: the prompt ids on the "
                     "device, unwrap_model_for_generation, no_grad, generate; every completion returned as "
                     "max_completion_length non-EOS tokens instead of read back and cut at its EOS",
                     "trl/trainer/grpo_trainer.py _generate_single_turn"),
           Emulation("host_reads_of_meta", ".tolist()/.cpu() of a meta tensor (TRL's logged rewards and "
                     "advantages) give zeros on the host", "trl/trainer/grpo_trainer.py _generate_and_score_completions"),
           Emulation("meta_device_accelerator", "the trainer's accelerator.device is meta: the generation batch's "
                     "tensors are made where the model is, as on CUDA", "trl/trainer/grpo_trainer.py "
                     "_generate_and_score_completions (device = self.accelerator.device)")):
    EMULATIONS.setdefault(_e.name, _e)


def check_grpo_traced(setup: TrainingSetup) -> None:
    """Refuse what this trace does not run: vLLM generation (not installed; its own engine and pool)."""
    if setup.recipe != Recipe.grpo:
        return
    if setup.generation.value != "hf":
        raise UserError(f"reportgen trace: recipe grpo with generation {setup.generation.value} is estimated only: "
                        "vLLM is not installed here and its engine (weights copy, KV pool, CUDA graphs) has no "
                        "meta-device run", hint="--generation hf traces transformers' generate; reportgen estimate "
                                               "--recipe grpo models vLLM's pool")


class _MetaAccelerator:
    """The trainer's accelerator with ``device`` meta and ``backward`` marked (everything else its own)."""

    def __init__(self, accelerator, backward):
        import torch

        self._accelerator, self.backward, self.device = accelerator, backward, torch.device("meta")

    def __getattr__(self, name):
        return getattr(self._accelerator, name)


@contextlib.contextmanager
def _fixed_length(total: int, use):
    """transformers' stop check answers "stop" at ``total`` tokens (``fixed_length_generation``)."""
    import transformers.generation.utils as GU

    saved = GU.StopCheck.__call__

    def call(self, unfinished_sequences, tokens, length):
        use("fixed_length_generation")
        return length >= total

    GU.StopCheck.__call__ = call
    try:
        yield
    finally:
        GU.StopCheck.__call__ = saved


@contextlib.contextmanager
def _quiet_trl():
    """TRL's warning that every reward is None reads ``isnan(rewards).all()`` from the device, which meta answers
    True (``host_reads_of_meta``): the rewards are ``zero_reward``'s 0.0, so the warning is noise here."""
    import logging

    logger = logging.getLogger("trl.trainer.grpo_trainer")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _generate_single_turn(trainer, setup: TrainingSetup, use):
    """TRL's hf generation path on meta (``completion_ids_on_host``)."""
    import torch
    from trl.models.utils import unwrap_model_for_generation

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        use("completion_ids_on_host")
        ids = torch.tensor(prompt_ids).to(trainer.accelerator.device)  # equal lengths: no padding
        mask = torch.ones_like(ids)
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                         generation_kwargs=trainer.generation_kwargs,
                                         gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
                                         ) as unwrapped, torch.no_grad():
            out = unwrapped.generate(input_ids=ids, attention_mask=mask, generation_config=trainer.generation_config)
        del out, ids, mask
        token = trainer.processing_class.convert_tokens_to_ids("a")
        return [[token] * setup.max_completion_length for _ in prompt_ids], None

    return generate


def _phases(trainer, rec, setup: TrainingSetup, use) -> None:
    """Phase marks around TRL's generation and scoring; the work counter skips them (module docstring)."""
    generate, score, prepare = trainer._generate, trainer._generate_and_score_completions, trainer._prepare_inputs
    counted = {"step": rec.count_step}

    def generate_and_score(inputs):
        counted["step"], rec.count_step = rec.count_step, -1
        rec.set_phase("generation")
        return score(inputs)

    def generated(prompts):
        out = generate(prompts)
        rec.set_phase("scoring")
        return out

    def prepared(batch):
        out = prepare(batch)
        if rec.phase == "scoring":
            rec.count_step = counted["step"]
            rec.set_phase("forward")
        return out

    trainer._generate_and_score_completions, trainer._generate = generate_and_score, generated
    trainer._prepare_inputs = prepared
    trainer._generate_single_turn = _generate_single_turn(trainer, setup, use)


def grpo_step(state: dict, setup: TrainingSetup):
    """``measure.step.train_step``'s replacement: Trainer's loop over TRL's ``training_step`` (module docstring)."""
    def step(model, optimizer, batches, accum, autocast, scaler=None, last_loss=None, mark=None, **_):
        from torch.fx.experimental import _config as fx_config

        from reportgen.trace.sft import _dispatch_mode

        recipe, use = state["recipe"], state["use"]
        trainer = recipe.trainer
        use("data_dependent_scalars")
        use("meta_device_accelerator")

        def backward(loss, **kwargs):
            mark("backward")
            (scaler.scale(loss) if scaler is not None else loss).backward()

        trainer.accelerator = _MetaAccelerator(state["accelerator"], backward)
        trainer.compute_loss_context_manager = autocast  # the harness's autocast, around compute_loss only
        trainer._step = 0  # each traced step generates (module docstring)
        trainer.current_gradient_accumulation_steps = accum  # Trainer's loop sets it per optimizer step
        rows = recipe.generation_batch(setup)
        with _dispatch_mode(use), fx_config.patch(meta_nonzero_assume_all_nonzero=True):
            for _ in range(accum):
                mark("forward")
                loss = trainer.training_step(model, rows, None)
                del loss
        mark("optimizer-step")
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        mark("zero-grad")
        optimizer.zero_grad(set_to_none=True)
        mark("end")

    return step


@contextlib.contextmanager
def grpo_trace(setup: TrainingSetup):
    """Run ``trace_case`` of a recipe-grpo ``setup`` through TRL's ``GRPOTrainer`` (module docstring)."""
    import tempfile

    import reportgen.measure.build as B
    import reportgen.measure.optimizers as O
    import reportgen.measure.step as S
    import reportgen.trace.step as T
    from reportgen.measure.grpo import make_grpo_trainer
    from reportgen.measure.sft import trainer_optimizer
    from reportgen.trace.sft import _trl_on_meta, emulation_hooks, patched

    check_grpo_traced(setup)
    state: dict = {}
    Applied, use = emulation_hooks(state)
    build, make_optimizer, register_model = B.build, O.make_optimizer, T.register_model

    def built(spec, s, device, **kw):
        out = build(spec, s, device, **kw)
        ref = None
        if s.beta > 0 and s.method == Method.full:  # TRL's reference model: the same build, no checkpointing
            ref = build(spec, s.model_copy(update={"grad_ckpt": False}), device, **kw).model
            ref.eval()
        recipe = state["recipe"] = make_grpo_trainer(out.model, s, device, state["dir"], ref_model=ref)
        state["accelerator"] = recipe.trainer.accelerator
        out.model = recipe.model
        out.notes.append("traced through TRL GRPOTrainer (generation hf: transformers' generate)")
        out.notes.append("the traced step's time prices the policy step's work only (generation and scoring are "
                         "not counted: reportgen estimate --recipe grpo prices them)")
        return out

    def optimizer(params, s, device):
        opt = trainer_optimizer(state["recipe"], s) if "recipe" in state else None
        return opt if opt is not None else make_optimizer(params, s, device)

    def register(rec, model, s, applied):
        register_model(rec, model, s, applied)
        ref = state["recipe"].ref_model
        if ref is not None:
            for name, t in [*ref.named_parameters(), *ref.named_buffers()]:
                rec.track(t, f"build: ref_model.{name}", "weights")
        _phases(state["recipe"].trainer, rec, s, use)

    with tempfile.TemporaryDirectory() as out, _trl_on_meta(use), _fixed_length(setup.seq, use), _quiet_trl():
        state["dir"] = out
        with patched((B, "build", built), (O, "make_optimizer", optimizer), (S, "train_step", grpo_step(state, setup)),
                     (T, "Applied", Applied), (T, "register_model", register)):
            yield
