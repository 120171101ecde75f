"""Library versions whose behaviour changes what a training step holds in memory.

The estimator models the libraries the measuring harness runs (``CURRENT``). Older versions that
behaved differently are modelled only where the difference is a documented code change, so that
measurements published with those versions (``reportgen/published``) can be compared fairly:

* bitsandbytes <= 0.43.1: ``MatMul4Bit.forward`` kept its input on the autograd context
  (``ctx.tensors = (A, B)``) whenever an input needed a gradient, although the backward never uses
  it (the 4-bit weight gets no gradient). 0.43.2 (2024-07-23) stores ``(None, B)``
  (``bitsandbytes/autograd/_functions.py``; checked in the 0.42.0, 0.43.1, 0.43.2 and 0.50.2 wheels).
  Every 4-bit linear whose input requires a gradient therefore keeps that input alive until its
  backward, like a trainable linear would. The input is a plain ``ctx`` attribute, not saved with
  ``save_for_backward``, so it even outlives the backward while the step's graph stays referenced.
* transformers < 4.46: a causal LM called with ``labels`` returned its logits upcast to fp32
  (``logits = logits.float()`` in ``LlamaForCausalLM.forward``); from 4.46 the upcast moved into the
  loss function (``loss/loss_utils.py`` ``ForCausalLMLoss``, PRs #33902 and #34147) and the returned
  logits are in the compute dtype. It matters when a training loop keeps its outputs
  (``keep_outputs``): what stays alive is that returned tensor.
* Lightning Fabric (litgpt): ``_FabricModule.forward`` casts every floating output to the default
  dtype, fp32 (``precision.convert_output``), so the logits a litgpt loop keeps are fp32.
* Liger-Kernel's fused linear cross-entropy sums the LM head's weight gradient chunk by chunk
  (``ops/fused_linear_cross_entropy.py``): up to 0.6.1 with ``torch.addmm(..., out=grad_weight)`` in
  place; 0.6.2 (2025-08-21) to 0.8.2 with ``grad_weight += torch.mm(...).float()``, a ``V x H`` product
  and its fp32 copy per chunk (read in the 0.6.2-0.8.2 tags); 0.8.1 adds ``torch.addmm(...,
  out_dtype=torch.float32, out=grad_weight)`` for an fp32 gradient of 16-bit products on torch 2.8 or
  later (PR #1239, issue #1232; 0.8.2 limits it to compute capability 8.0 and up); 0.8.3 accumulates
  16-bit gradients in place too (PR #1454, the 0.8.3 release notes' "low-precision weight-gradient
  accumulation"). ``logits.liger_grad_weight_traffic`` prices both paths.
"""

from __future__ import annotations

from dataclasses import dataclass


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("+")[0].split(".")[:3])
    except ValueError:
        raise ValueError(f"library version {text!r}: expected digits like '0.43.1'") from None


@dataclass(frozen=True)
class Libraries:
    bitsandbytes: str = "0.50.2"
    transformers: str = "5.23.0"
    lightning: str | None = None  # Lightning Fabric wraps the model (litgpt)
    liger_kernel: str = "0.8.5"

    @property
    def bnb_4bit_holds_input(self) -> bool:
        """bitsandbytes <= 0.43.1 keeps each 4-bit linear's input for backward (see module doc)."""
        return _version(self.bitsandbytes) < (0, 43, 2)

    @property
    def returned_logits_fp32(self) -> bool:
        """The model hands back fp32 logits (module doc: Fabric, or transformers < 4.46)."""
        return self.lightning is not None or _version(self.transformers) < (4, 46)


    def flce_in_place(self, c: int, w: int) -> bool:
        """Liger's fused linear cross-entropy adds each chunk's head gradient (products in ``c`` bytes) into a
        ``w``-byte ``grad_weight`` inside the GEMM, without a ``V x H`` temporary (module doc)."""
        v = _version(self.liger_kernel)
        if v < (0, 6, 2):
            return True
        if w == 4 and c != 4:
            return v >= (0, 8, 1)
        return v >= (0, 8, 3) and w == c and c != 4


#: the versions the measuring harness installs (``scripts/gpu_wheels.sh``)
CURRENT = Libraries()
