"""``reportgen trace --recipe torchtune --from CONFIG.yaml``: torchtune 0.6.1's own single-device LoRA recipe
(``recipes/lora_finetune_single_device.py``, ``LoRAFinetuneRecipeSingleDevice``) on the meta device, under the
tracer's recorder and caching-allocator replay.

Kept apart from the loop's tracer (``fingerprint.RECIPE_TRACE_SOURCES["torchtune"]``). ``torchtune_trace(setup,
path)`` is entered around ``trace_case`` as ``grpo.grpo_trace`` is, and hands ``run_trace`` the recipe through the
functions it imports when it runs: ``measure.build.build`` (the recipe's ``setup(cfg)``: its ``_setup_model``
builds the model with torchtune's builder under ``training.set_default_dtype`` on the recipe's device, sets the
adapters trainable, applies torchtune's activation checkpointing (``training.set_activation_checkpointing``:
``checkpoint_wrapper``, non-reentrant, on every ``TransformerSelfAttentionLayer``) and loads the checkpoint;
then its optimizer, loss (``set_num_output_chunks`` for ``CEWithChunkedOutputLoss``), dataloader with its
``padded_collate_sft`` and scheduler), ``measure.optimizers.make_optimizer`` (the recipe's optimizer),
``trace.step.register_model`` (also the recipe's ``ignore_labels_cache``), ``trace.step._wrap_checkpointing``
(torchtune's ``CheckpointWrapper`` recomputes under the CUDA function emulation as transformers' layers do)
and ``measure.step.train_step``, replaced by the recipe's own ``train()`` for one optimizer step
(``max_steps_per_epoch`` 1 over ``gradient_accumulation_steps`` batches): ``utils.batch_to_device``, the token
count, ``_loss_step`` (forward under its activations context, ``torch.hstack`` of the shifted labels, the loss,
``del logits``), ``backward()`` of loss x tokens, ``training.scale_grads``, ``clip_grad_norm_`` when the file
sets it, ``optimizer.step()``, ``zero_grad(set_to_none=True)``, the scheduler's step.

The config is the user's file with the setup's values written into it (``batch_size``,
``gradient_accumulation_steps``, ``enable_activation_checkpointing``, the loss, ``dtype``, LoRA rank, alpha,
dropout and targets: so a flag beside ``--from`` overrides the file here as for the estimate), and its file-reading
components replaced (emulations below). What is not traced is refused with its reason
(``check_torchtune_traced``): the full-fine-tuning and distributed recipes, QLoRA (torchao's NF4 tensors),
``compile``, activation offloading, packed datasets.

Emulations (what a CUDA run does that meta cannot, and how each is stood in for):

* ``tt_checkpoint_on_meta``: the checkpointer (``FullModelHFCheckpointer``: safetensors read to the host,
  converted to torchtune's keys) is replaced by the base weights of a second meta build of the same builder:
  the same keys, shapes and dtype, loaded by the recipe's ``load_state_dict(strict=False)`` and checked by its
  ``validate_missing_and_unexpected_for_lora``. The host copy is no device memory on CUDA either.
* ``tt_token_rows``: the tokenizer and dataset are replaced by ``batch x accum`` rows of ``seq`` tokens (every
  label valid); the recipe's own sampler, ``StatefulDataLoader`` and ``padded_collate_sft`` make the batches on
  the host and its ``batch_to_device`` moves them, as on CUDA.
* ``tt_no_logging_or_saving``: the metric logger writes nothing, the profiler is torchtune's
  disabled one, ``get_memory_stats`` (a CUDA query) and the progress bar are not run, nor the epoch-end
  ``save_checkpoint`` (after the traced steps).
* ``tt_rope_cache_on_meta``: ``Llama3ScaledRoPE.rope_init`` returns early on meta (its frequency scaling reads
  each value on the host), leaving no cache; on CUDA the model is built on the device and the cache is built at
  init. Here ``theta`` (``dim / 2`` fp32) is made on meta and the module's own ``build_rope_cache(max_seq_len)``
  makes the ``max_seq_len x dim / 2 x 2`` fp32 cache, as on CUDA.
* ``tt_dora_magnitude_on_meta``: ``DoRALinear.initialize_dora_magnitude`` refuses meta parameters (on CUDA they
  hold the loaded weights); here its own three steps run on meta (the base weight in the adapters' dtype,
  ``lora_b @ lora_a``, ``_get_weight_norm`` copied into ``magnitude``), under ``no_grad`` as it is.
* ``data_dependent_scalars``: ``.item()`` of the running loss (``trace/sft.py``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from reportgen.errors import UserError
from reportgen.setup import Method, TrainingSetup
from reportgen.trace.emulations import EMULATIONS, Emulation

#: the torchtune the recipe trace runs (the one ``configs/torchtune.py`` reads keys from)
TORCHTUNE_VERSION = "0.6.1"
#: what to install: torchtune 0.6.1 imports ``torchao.dtypes.nf4tensor``, which torchao 0.10-0.12 have (torchtune
#: 0.6.1's CI); torchdata 0.11.0 is its pinned dataloader, omegaconf its config reader
INSTALL_HINT = ("pip install torchtune==0.6.1 torchao==0.10.0 torchdata==0.11.0 omegaconf  (torchtune 0.6.1 imports "
                "torchao.dtypes.nf4tensor, which torchao 0.13 and later moved)")
RECIPE = "lora_finetune_single_device"
LOSSES = {"chunked": "torchtune.modules.loss.CEWithChunkedOutputLoss", "standard": "torch.nn.CrossEntropyLoss"}

for _e in (Emulation("tt_checkpoint_on_meta", "torchtune's checkpointer is replaced by the base weights of a "
                     "second meta build of the same builder (keys, shapes, dtype), loaded by the recipe's "
                     "load_state_dict(strict=False) and LoRA key validation; no file is read",
                     "recipes/lora_finetune_single_device.py load_checkpoint, _setup_model"),
           Emulation("tt_token_rows", "torchtune's tokenizer and dataset are replaced by batch x accum rows of seq "
                     "tokens (every label valid), collated by the recipe's own padded_collate_sft and "
                     "StatefulDataLoader on the host and moved by its batch_to_device",
                     "recipes/lora_finetune_single_device.py _setup_data; torchtune/data/_collate.py"),
           Emulation("tt_no_logging_or_saving", "the metric logger writes nothing, the profiler is "
                     "torchtune's disabled one, get_memory_stats (a CUDA query), the progress bar and the "
                     "epoch-end save_checkpoint are not run (no device memory in the step)",
                     "recipes/lora_finetune_single_device.py setup, train, save_checkpoint"),
           Emulation("tt_rope_cache_on_meta", "Llama3ScaledRoPE.rope_init returns early on meta (its scaling reads "
                     "each frequency on the host): theta (dim/2 fp32) is made on meta and the module's own "
                     "build_rope_cache(max_seq_len) makes its fp32 cache, as a build on CUDA does at init",
                     "torchtune/models/llama3_1/_position_embeddings.py Llama3ScaledRoPE.rope_init"),
           Emulation("tt_dora_magnitude_on_meta", "DoRALinear.initialize_dora_magnitude refuses meta parameters: its "
                     "own steps (base weight in the adapters' dtype, lora_b @ lora_a, _get_weight_norm into "
                     "magnitude) run on meta under no_grad", "torchtune/modules/peft/dora.py "
                     "DoRALinear.initialize_dora_magnitude")):
    EMULATIONS.setdefault(_e.name, _e)

#: the trace's state while a recipe runs: the meta checkpoint's builder (read by ``MetaCheckpointer``)
_ACTIVE: dict = {}


def recipe_status(setup: TrainingSetup) -> str:
    """What reportgen gives for a torchtune config of ``setup``: ``traced`` (this module runs torchtune's own
    recipe), or ``estimated`` with the reason (``check_torchtune_traced``'s refusal)."""
    try:
        check_torchtune_traced(setup)
    except UserError as exc:
        return f"estimated ({exc.message})"
    return "traced"


def check_torchtune_traced(setup: TrainingSetup) -> None:
    """Refuse, with the reason, what the trace of torchtune's recipe does not run."""
    what = "reportgen trace --recipe torchtune"
    if setup.method == Method.full:
        raise UserError(f"{what}: full fine-tuning (full_finetune_*.py) is estimated only: the trace runs "
                        f"torchtune's {RECIPE} recipe", hint="reportgen estimate --from FILE; reportgen trace --from "
                        "FILE (without --recipe torchtune) traces the harness's loop with the same setup")
    if setup.method == Method.qlora:
        raise UserError(f"{what}: QLoRA is estimated only: torchao's NF4Tensor (to_nf4, linear_nf4) has no meta "
                        "kernels the trace emulates", hint="reportgen estimate --from FILE")
    if setup.gpus > 1 or setup.sharding.value != "none":
        raise UserError(f"{what}: the distributed recipes (FSDP2) are estimated only", hint="--gpus 1")
    if setup.compile:
        raise UserError(f"{what}: compile: true is estimated only (torch.compile's kernels do not run on meta)",
                        hint="--no-compile, or reportgen estimate --from FILE")
    if setup.loss.value == "chunked-compiled":
        raise UserError(f"{what}: loss chunked-compiled (compile: true compiles the loss) is estimated only",
                        hint="--loss chunked (CEWithChunkedOutputLoss, not compiled)")
    if setup.act_offload:
        raise UserError(f"{what}: enable_activation_offloading is estimated only (OffloadActivations copies to "
                        "pinned host memory on CUDA streams, which meta has not)", hint="--no-act-offload")
    if setup.padding.value == "packed":
        raise UserError(f"{what}: dataset.packed: true is estimated only (torchtune attends within each packed "
                        "sample with flex attention's compiled kernels)", hint="--padding longest")
    _targets(setup)  # refuses what torchtune's builders cannot target
    if setup.loss.value not in LOSSES:
        raise UserError(f"{what}: loss {setup.loss.value} is not one of torchtune's losses",
                        hint="--loss chunked (CEWithChunkedOutputLoss) or --loss standard (CrossEntropyLoss)")


def import_recipe():
    """torchtune's LoRA recipe class, or a ``UserError`` saying what to install. The recipe is loaded from its
    file beside the ``torchtune`` package, as ``tune run`` finds it (``torchtune/_cli/run.py``: ``ROOT`` is the
    package's parent; the ``recipes`` directory is not importable as a package)."""
    import importlib.util
    import sys
    from importlib.metadata import PackageNotFoundError, version

    name = f"_reportgen_torchtune_{RECIPE}"
    if name in sys.modules:
        return sys.modules[name].LoRAFinetuneRecipeSingleDevice
    try:
        found = version("torchtune")
        import torchtune
    except (ImportError, PackageNotFoundError) as exc:  # torchao 0.13+ moved torchao.dtypes.nf4tensor
        raise UserError(f"reportgen trace --recipe torchtune needs torchtune {TORCHTUNE_VERSION} and its "
                        f"dependencies ({type(exc).__name__}: {exc})", hint=INSTALL_HINT) from None
    if found.split("+")[0] != TORCHTUNE_VERSION:
        raise UserError(f"reportgen trace --recipe torchtune runs torchtune {TORCHTUNE_VERSION}'s recipe; "
                        f"{found} is installed", hint=INSTALL_HINT)
    path = Path(torchtune.__file__).parent.parent / "recipes" / f"{RECIPE}.py"
    if not path.is_file():
        raise UserError(f"reportgen trace --recipe torchtune: torchtune's recipe {path} is not installed",
                        hint=INSTALL_HINT)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[name]
        raise UserError(f"reportgen trace --recipe torchtune: torchtune's recipe does not import "
                        f"({type(exc).__name__}: {exc})", hint=INSTALL_HINT) from None
    return module.LoRAFinetuneRecipeSingleDevice


class NoTokenizer:
    """``cfg.tokenizer``'s stand-in (``tt_token_rows``): the recipe reads ``pad_id`` for its collate."""

    def __init__(self, max_seq_len=None, **_):
        self.pad_id, self.max_seq_len = 0, max_seq_len


class TokenRows:
    """``cfg.dataset``'s stand-in (``tt_token_rows``): ``rows`` samples of ``seq`` tokens, every label valid."""

    def __init__(self, tokenizer, rows: int, seq: int, packed: bool = False):
        self.rows, self.seq = rows, seq

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict:
        return {"tokens": [1] * self.seq, "labels": [1] * self.seq}


class NoMetricLogger:
    """``cfg.metric_logger``'s stand-in (``tt_no_logging_or_saving``): torchtune's ``MetricLoggerInterface``,
    writing nothing (its ``DiskLogger`` prints where it writes, on stdout)."""

    def __init__(self, **_):
        pass

    def log_config(self, config) -> None:
        pass

    def log(self, name, data, step) -> None:
        pass

    def log_dict(self, payload, step) -> None:
        pass

    def close(self) -> None:
        pass


class MetaCheckpointer:
    """``cfg.checkpointer``'s stand-in (``tt_checkpoint_on_meta``): the base weights of a meta build."""

    def __init__(self, **_):
        pass

    def load_checkpoint(self) -> dict:
        import torch
        from torchtune import config, training
        from torchtune.modules.peft import get_adapter_params

        with training.set_default_dtype(_ACTIVE["dtype"]), torch.device("meta"):
            model = config.instantiate(_ACTIVE["cfg_model"])
        adapters = set(get_adapter_params(model))
        return {training.MODEL_KEY: {k: v for k, v in model.state_dict().items() if k not in adapters}}


def recipe_config(path: Path, setup: TrainingSetup, out_dir: str):
    """The user's torchtune config with the setup's values and the stand-ins written in (module docstring)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    here = "reportgen.trace.torchtune_recipe"
    cfg.output_dir, cfg.device, cfg.seed = out_dir, "cpu", 0  # the device is set to meta after __init__
    cfg.dtype = {"bf16": "bf16", "fp32": "fp32"}[setup.precision.value]
    cfg.batch_size, cfg.gradient_accumulation_steps = setup.batch, setup.accum
    cfg.enable_activation_checkpointing, cfg.enable_activation_offloading = setup.grad_ckpt, False
    cfg.compile, cfg.resume_from_checkpoint, cfg.max_steps_per_epoch, cfg.epochs = False, False, 1, 1
    cfg.model.lora_rank, cfg.model.lora_alpha = setup.lora_rank, setup.lora_alpha
    cfg.model.lora_dropout = setup.lora_dropout
    cfg.model.lora_attn_modules, cfg.model.apply_lora_to_mlp, cfg.model.apply_lora_to_output = _targets(setup)
    if OmegaConf.select(cfg, "loss._component_") != LOSSES[setup.loss.value]:
        cfg.loss = {"_component_": LOSSES[setup.loss.value]}
    cfg.tokenizer = {"_component_": f"{here}.NoTokenizer", "max_seq_len": setup.seq}
    cfg.dataset = {"_component_": f"{here}.TokenRows", "rows": setup.batch * setup.accum, "seq": setup.seq}
    cfg.checkpointer = {**(OmegaConf.to_container(cfg.checkpointer) if "checkpointer" in cfg else {}),
                        "_component_": f"{here}.MetaCheckpointer"}  # its model_type is read by the recipe
    cfg.metric_logger = {"_component_": f"{here}.NoMetricLogger"}
    cfg.profiler = {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False}
    cfg.log_peak_memory_stats = False
    return cfg


#: the setup's LoRA target names -> torchtune's (``configs/torchtune.py`` ``ATTN`` read backwards)
ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}


def _targets(setup: TrainingSetup) -> tuple[list[str], bool, bool]:
    """``--lora-targets`` as torchtune's ``lora_attn_modules``, ``apply_lora_to_mlp``, ``apply_lora_to_output``."""
    names = set(setup.lora_targets.split(","))
    if names & {"qkv", "gate_up"}:  # configs/torchtune.py: phi3/phi4 builders read as HF Phi-3's fused modules
        raise UserError(f"--lora-targets {setup.lora_targets}: a Phi-3/Phi-4 builder's adapters are estimated on HF "
                        "Phi-3's fused qkv_proj and gate_up_proj, which torchtune's model keeps apart: its recipe is "
                        "not traced", hint="reportgen estimate --from the file estimates it (approximated)")
    if "all-linear" in names:
        names |= {*ATTN, "gate", "up", "down"}
    mlp = names & {"gate", "up", "down"}
    if mlp and len(mlp) < 3 or names - {*ATTN, "gate", "up", "down", "lm_head", "all-linear"}:
        raise UserError(f"--lora-targets {setup.lora_targets}: torchtune's builders take q, k, v, o, the whole MLP "
                        "(apply_lora_to_mlp: gate, up and down together) and lm_head (apply_lora_to_output)",
                        hint="e.g. --lora-targets q,v,o,gate,up,down")
    return [ATTN[n] for n in ATTN if n in names], bool(mlp), "lm_head" in names


def _make_recipe(cls, cfg, use):
    """The recipe, set up on meta (``recipe.setup(cfg)`` as ``tune run`` calls it, device meta)."""
    import torch
    from torchtune import training

    recipe = cls(cfg=cfg)
    recipe._device = torch.device("meta")
    _ACTIVE.update(dtype=recipe._dtype, cfg_model=cfg.model)
    from torchtune.modules.peft import DoRALinear

    saved = training.get_memory_stats, training.log_memory_stats, DoRALinear.initialize_dora_magnitude
    training.get_memory_stats, training.log_memory_stats = (lambda device, reset_stats=True: {}), \
        (lambda stats, message="": None)
    DoRALinear.initialize_dora_magnitude = _dora_magnitude(use)
    try:
        for name in ("tt_checkpoint_on_meta", "tt_token_rows", "tt_no_logging_or_saving"):
            use(name)
        recipe.setup(cfg=cfg)
    finally:
        training.get_memory_stats, training.log_memory_stats, DoRALinear.initialize_dora_magnitude = saved
    model = recipe._model
    _rope_caches(model, use)
    if not hasattr(model, "config"):  # trace.step reads the vocabulary from model.config, as transformers has it
        from types import SimpleNamespace

        model.config = SimpleNamespace(vocab_size=model.tok_embeddings.num_embeddings)
    return recipe


def _dora_magnitude(use):
    """``DoRALinear.initialize_dora_magnitude``'s steps without its meta check (``tt_dora_magnitude_on_meta``)."""
    import torch

    @torch.no_grad()
    def initialize(self):
        use("tt_dora_magnitude_on_meta")
        base_weight = self.weight.to(self.lora_a.weight.dtype)
        lora_weight = self.lora_b.weight @ self.lora_a.weight
        self.magnitude.copy_(self._get_weight_norm(base_weight, lora_weight))

    return initialize


def _rope_caches(model, use) -> None:
    """The RoPE caches a CUDA build makes at init (``tt_rope_cache_on_meta``)."""
    import torch

    for m in model.modules():
        if getattr(m, "is_cache_built", True) or not hasattr(m, "build_rope_cache"):
            continue
        use("tt_rope_cache_on_meta")
        m.register_buffer("theta", torch.empty(m.dim // 2, dtype=torch.float32, device="meta"), persistent=False)
        m.build_rope_cache(m.max_seq_len)
        m.is_cache_built = True


def _wrap_tt_checkpointing(original):
    """``trace.step._wrap_checkpointing`` plus torchtune's ``CheckpointWrapper``: its ``checkpoint_fn`` calls the
    wrapped layer through a function that re-enters the CUDA function emulation during the recomputation."""
    def wrap(model, rec, functions):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        restore = original(model, rec, functions)
        for module in model.modules():
            if not isinstance(module, CheckpointWrapper):
                continue
            fn = module.checkpoint_fn

            def checkpointed(layer, *args, _fn=fn, **kwargs):
                def run(*a, **k):
                    if "backward" not in rec.phase:
                        return layer(*a, **k)
                    rec.recomputing = True
                    try:
                        with functions:
                            return layer(*a, **k)
                    finally:
                        rec.recomputing = False

                return _fn(run, *args, **kwargs)

            module.checkpoint_fn = checkpointed
        return restore

    return wrap


@contextlib.contextmanager
def _step_marks(recipe, optimizer, mark):
    """The tracer's phase marks at the recipe's own calls: ``batch_to_device`` (forward), ``Tensor.backward``,
    ``training.scale_grads`` (the optimizer step's start), ``optimizer.zero_grad``."""
    import torch
    import torchtune.utils as U
    from torchtune import training

    saved = U.batch_to_device, torch.Tensor.backward, training.scale_grads, optimizer.zero_grad

    def to_device(batch, device):
        mark("forward")
        return saved[0](batch, device)

    def backward(self, *a, **k):
        mark("backward")
        return saved[1](self, *a, **k)

    def scale_grads(model, scaler):
        mark("optimizer-step")
        return saved[2](model, scaler)

    def zero_grad(*a, **k):
        mark("zero-grad")
        return saved[3](*a, **k)

    U.batch_to_device, torch.Tensor.backward, training.scale_grads, optimizer.zero_grad = \
        to_device, backward, scale_grads, zero_grad
    try:
        yield
    finally:
        U.batch_to_device, torch.Tensor.backward, training.scale_grads = saved[:3]
        del optimizer.zero_grad


def tt_step(state: dict):
    """``measure.step.train_step``'s replacement: the recipe's ``train()`` for one optimizer step."""
    def step(model, optimizer, batches, accum, autocast, scaler=None, last_loss=None, mark=None, **_):
        import sys
        from functools import partial

        from reportgen.trace.sft import _dispatch_mode

        recipe, use = state["recipe"], state["use"]
        batches.clear()  # the harness's token batches: the recipe's dataloader makes its own (tt_token_rows)
        use("data_dependent_scalars")
        module = sys.modules[type(recipe).__module__]
        tqdm = module.tqdm
        module.tqdm = partial(tqdm, disable=True)  # tt_no_logging_or_saving
        recipe.epochs_run, recipe.total_epochs, recipe.max_steps_per_epoch = 0, 1, 1
        recipe.save_checkpoint = lambda epoch: None  # tt_no_logging_or_saving: after the traced step
        try:
            with _step_marks(recipe, optimizer, mark), _dispatch_mode(), autocast():
                recipe.train()
        finally:
            module.tqdm = tqdm
            del recipe.save_checkpoint
        mark("end")

    return step


@contextlib.contextmanager
def _quiet_torchtune():
    """torchtune's INFO lines (each of its modules resets its logger's level on import: a filter stays) and the
    Python warnings of its libraries, to keep the trace's output the trace's."""
    import logging
    import warnings

    logger = logging.getLogger("torchtune.utils._logging")

    def errors_only(record):
        return record.levelno >= logging.ERROR

    logger.addFilter(errors_only)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.removeFilter(errors_only)


@contextlib.contextmanager
def torchtune_trace(setup: TrainingSetup, path: Path):
    """Run ``trace_case`` of ``setup`` through torchtune's LoRA recipe read from ``path`` (module docstring)."""
    import tempfile

    import reportgen.measure.build as B
    import reportgen.measure.optimizers as O
    import reportgen.measure.step as S
    import reportgen.trace.step as T
    from reportgen.trace.sft import emulation_hooks, patched

    check_torchtune_traced(setup)
    cls = import_recipe()
    state: dict = {}
    Applied, use = emulation_hooks(state)
    register_model, wrap_ckpt = T.register_model, T._wrap_checkpointing

    def built(spec, s, device, **kw):
        recipe = state["recipe"] = _make_recipe(cls, recipe_config(path, s, state["dir"]), use)
        notes = [f"traced through torchtune {TORCHTUNE_VERSION}'s {RECIPE} recipe (LoRAFinetuneRecipeSingleDevice: "
                 "its builder, activation checkpointing, loss, optimizer and train loop)"]
        return B.Built(model=recipe._model, attn_implementation="sdpa", storage_dtype=s.precision.value,
                       compute_dtype=s.precision.value, adapter_dtype=s.precision.value, notes=notes)

    def register(rec, model, s, applied):
        register_model(rec, model, s, applied)
        rec.track(state["recipe"].ignore_labels_cache, "build: ignore_labels_cache", "inputs")

    with tempfile.TemporaryDirectory() as out, _quiet_torchtune():
        state["dir"] = out
        try:
            with patched((B, "build", built), (O, "make_optimizer", lambda p, s, d: state["recipe"]._optimizer),
                         (S, "train_step", tt_step(state)), (T, "Applied", Applied), (T, "register_model", register),
                         (T, "_wrap_checkpointing", _wrap_tt_checkpointing(wrap_ckpt))):
                yield
        finally:
            _ACTIVE.clear()


def torchtune_dict(spec, gpu, setup: TrainingSetup, d: dict) -> dict:
    """A trace's ``as_dict()`` with this recipe's ``trace_hash``, torchtune's and torchao's versions, and the
    comparison with ``reportgen estimate`` of the same setup (``agreement.torchtune_agreement``)."""
    from importlib.metadata import PackageNotFoundError, version

    from reportgen.estimate import estimate
    from reportgen.fingerprint import trace_hash
    from reportgen.trace.agreement import torchtune_agreement

    env = dict(d.get("environment") or {})
    for pkg in ("torchtune", "torchao"):
        try:
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    # the traced step is torchtune's model, so the estimate prices it (``setup.modeling``, as --from sets it)
    est = estimate(spec, gpu, setup.model_copy(update={"modeling": "torchtune"}), reverse=False)
    return {**d, "trace_hash": trace_hash("torchtune"), "environment": env,
            "torchtune": torchtune_agreement(d["memory"], est.memory.as_dict(), recipe_status(setup))}
