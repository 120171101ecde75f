"""Liger-Kernel's layer kernels (``kernels: liger``): what its RMSNorm, RoPE and SwiGLU save and move.

``apply_liger_kernel_to_llama`` (and ``_mistral``, ``_qwen2``, ``_qwen3``; Liger-Kernel 0.6.4,
``transformers/monkey_patch.py``, ``rope``, ``rms_norm`` and ``swiglu`` on by default) replaces
three of transformers' modules with Triton kernels, one launch each way instead of a chain of ATen
ops. TRL's ``use_liger_kernel``, LLaMA-Factory's ``enable_liger_kernel`` and Axolotl's
``liger_rope``/``liger_rms_norm``/``liger_glu_activation`` call it. Read from its code
(``ops/rms_norm.py``, ``ops/rope.py``, ``ops/swiglu.py`` at v0.6.4):

* **RMSNorm** (``LigerRMSNormFunction``, casting mode ``llama``, ``in_place=True``): the forward
  kernel reads ``X`` and writes ``Y`` (``X``'s dtype) and ``RSTD`` (fp32, one per row); it saves
  ``X`` and ``RSTD`` (``ctx.save_for_backward(X, W, RSTD)``) whenever the graph needs a backward,
  where transformers' ``LlamaRMSNorm`` keeps an fp32 copy of ``X`` and, for a trainable weight, the
  normalised tensor. The backward kernel reads ``dY``, ``X`` and ``RSTD``, writes ``dX`` into ``dY``
  and the weight's partial sums (``sm_count x width`` fp32, computed even for a frozen weight),
  then ``_dW.sum(dim=0).to(W.dtype)``: a sum and, for a 16-bit weight, a cast.
* **RoPE** (``LigerRopeFunction``): one kernel rotates q and k in place (``q.transpose(1, 2)`` of
  transformers' layout is contiguous already) reading ``cos`` and ``sin``; it saves only ``cos`` and
  ``sin``, the shared tables, as the eager path does. The backward is the same kernel on dq, dk.
* **SwiGLU** (``LigerSiLUMulFunction`` in ``LigerSwiGLUMLP``): one kernel reads the gate and up
  outputs ``a``, ``b`` and writes ``c = silu(a) * b``; it saves ``a`` and ``b`` only (the eager path
  also keeps ``silu(a)``); the backward kernel recomputes ``silu(a)``, reads ``dc`` and writes
  ``da`` and ``db`` into ``a`` and ``b``: no new ``T x I`` gradient besides ``dc``.

Each kernel is a Python-level ``autograd.Function`` call both ways (Triton's launcher is Python).
Not modelled: Liger's kernels for other families (Gemma's offset RMSNorm and GeGLU, Phi-3's fused
``gate_up_proj``, Mixtral's experts: refused), its LayerNorm and its plain ``cross_entropy``; a model type
Liger has no kernels for runs transformers' modules. Qwen3's q/k norms stay transformers' (``QWEN3_NOTE``).
"""

from __future__ import annotations

from reportgen.errors import UserError
from reportgen.model import ModelSpec
from reportgen.setup import Kernels, TrainingSetup

#: the transformers ``model_type``s whose Liger patch (RMSNorm casting mode llama, SwiGLU MLP,
#: Llama's RoPE) is modelled here (Liger-Kernel 0.6.4 ``MODEL_TYPE_TO_APPLY_LIGER_FN``)
LIGER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: the catalog's other model types Liger 0.6.4 patches (its own kernels for them are not modelled)
LIGER_PATCHES_TOO = ("gemma", "gemma2", "gemma3_text", "gemma3", "mixtral", "olmo2", "qwen3_moe", "phi3",
                     "mistral3")


def check(model: ModelSpec, setup: TrainingSetup) -> None:
    """Refuse ``kernels: liger`` on a model type Liger patches with kernels this module does not model.
    A model type Liger has no kernels for (Phi-2's ``phi``) runs transformers' modules: Liger logs and
    patches nothing, and the estimate says so (``note``)."""
    if setup.kernels is Kernels.liger and model.model_type in LIGER_PATCHES_TOO:
        raise UserError(f"kernels=liger: Liger-Kernel's layer kernels are modelled for model types "
                        f"{', '.join(LIGER_MODEL_TYPES)}; {model.name} is {model.model_type!r}, whose Liger kernels "
                        "are not", hint="estimate it with --kernels eager (transformers' own modules): an upper "
                        "bound on memory and time, Liger's kernels saving both")


def note(model: ModelSpec) -> str:
    """What an estimate with ``kernels: liger`` says of it."""
    if model.model_type in LIGER_MODEL_TYPES:
        return NOTE + (QWEN3_NOTE if model.model_type == "qwen3" else "")
    return (f"kernels liger: Liger-Kernel has no kernels for model type {model.model_type!r} (it patches nothing): "
            "estimated with transformers' modules")


def rms_norm_saved(width: int, in_bytes: int, rows: int, needs_backward: bool) -> int:
    """Bytes per token ``LigerRMSNormFunction`` saves: ``X`` in its own dtype and the fp32 ``RSTD``
    of each of ``rows`` groups, when any input (``X`` or the weight) needs a gradient.

    Llama 3.2 1B, pure bf16, a layer's input norm: ``2 x 2048 + 4 = 4100`` bytes a token, where
    transformers' ``LlamaRMSNorm`` saves ``4 x 2048 + 4 + 2 x 2048 = 12292`` (``ops.rms_norm``)."""
    return in_bytes * width + 4 * rows if needs_backward else 0


def swiglu_saved(width: int, act_bytes: int) -> int:
    """Bytes per token ``LigerSiLUMulFunction`` saves: the gate and up outputs (``2 x I``), where the
    eager ``act_fn(gate) * up`` also keeps ``act_fn(gate)`` (``3 x I``)."""
    return 2 * act_bytes * width


#: what every estimate with ``kernels: liger`` says of it
NOTE = ("kernels liger: Liger-Kernel's RMSNorm, RoPE and SwiGLU priced from its code (0.6.4: one Triton kernel "
        "each way, less saved); not yet measured by this project on a GPU")

#: Qwen3's per-head q/k norms: the Trainer's ``use_liger_kernel`` (and the harness) patch the built model
#: (``_apply_liger_kernel_to_instance``), which replaces the model's, the layers' input and post-attention
#: norms only; LLaMA-Factory and Axolotl patch the classes before loading, so theirs are Liger's too
QWEN3_NOTE = ("; Qwen3's q/k norms priced as transformers' (the Trainer patches the built model, which leaves "
              "them; LLaMA-Factory and Axolotl patch them too: a few KB a token a layer less)")

#: the ``T x I`` gradients alive inside one layer's MLP backward: ``dc`` only (``da`` and ``db``
#: overwrite the saved ``a`` and ``b``), where the eager MLP holds gate, up and product gradients
MLP_BACKWARD_GRADIENTS = 1
