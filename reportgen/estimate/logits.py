"""Logits and loss: the ``tokens x vocab`` tensors at the end of the forward pass.

transformers' ``ForCausalLMLoss`` (``loss/loss_utils.py``) upcasts the logits with
``logits.float()`` and calls ``F.cross_entropy``, i.e. ``log_softmax`` (which saves its fp32
output) and ``nll_loss``. With a 128k-256k vocabulary these tensors outweigh a whole layer's
activations. Per token, with ``c`` the compute dtype's bytes and ``V`` the vocabulary:

* saved for backward: the fp32 log-softmax output (``4V``) and the int64 targets (8 bytes);
  Gemma 2's final soft-capping adds ``tanh``'s output (``cV``).
* live at the loss in the forward pass: the ``lm_head`` output (``cV``), its fp32 copy (``4V``,
  the same tensor when ``c = 4``) and the log-softmax output.
* live at the start of the backward pass: the saved log-softmax output, ``nll_loss``'s gradient
  and ``log_softmax``'s gradient, all fp32: ``12V`` (PyTorch ``LogSoftmax`` backward kernel needs
  the output, the incoming and the outgoing gradient at once).

``fused`` stands for a chunked linear-cross-entropy kernel (Liger-Kernel
``fused_linear_cross_entropy.py``): the logits of one chunk of tokens exist at a time, with the
chunk size Liger picks: ``next_pow2(ceil(T / ceil(V / h)))`` tokens.

``chunked`` is torchtune's ``CEWithChunkedOutputLoss`` (``modules/loss/ce_chunked_output_loss.py``,
``num_output_chunks = 8``): the head writes its 16-bit logits in 8 chunks of tokens and the loss
upcasts and cross-entropies one chunk at a time. Every chunk's fp32 log-softmax output is still
saved (``4V`` per token), but the fp32 copy of the logits and the backward's fp32 gradients exist
for one chunk only: forward ``cV + 4V + 4V/8``, backward ``4V + 8V/8 + cV/8`` per token.

``chunked-compiled`` is the same loss under torchtune's ``compile: True``: the recipes call
``training.compile_loss``, which compiles ``CEWithChunkedOutputLoss.compute_cross_entropy`` alone
(``apply_compile_strategy``: ``F.cross_entropy(logits.float(), labels, reduction="sum")`` of one chunk).
Inductor's partitioner saves, per chunk, its 16-bit logits input (the head's output, kept for the
backward to recompute the softmax), the int64 labels and two fp32 numbers per token (the row maximum
and the log-sum-exp), and no fp32 ``tokens x vocab`` tensor; the backward writes one chunk's
gradient in the logits' dtype. Measured with ``saved_tensors_hooks`` on torch 2.13's CPU Inductor
(``tests/test_logits_compiled.py``): eager saves 8 bytes per logit (the fp32 log-softmax output, saved
by ``log_softmax`` and ``nll_loss``: one tensor), the compiled chunk 2 (its bf16 input). Per token:
saved ``cV + 8 + 8``, forward ``cV + 16`` (the saved logits are the head's output), backward
``cV + 16 + cV/8`` (the chunks' gradients replace their inputs one chunk at a time).

``no-upcast`` is ``F.cross_entropy`` on the 16-bit logits themselves (no ``.float()``): ``log_softmax``
saves its 16-bit output (``cV``), the forward holds the head's output beside it (``2cV``) and the
backward the output, ``nll_loss``'s gradient and ``log_softmax``'s gradient, all 16-bit (``3cV``);
measured the same way: eager saves 4 bytes per bf16 logit (one 2-byte tensor, saved twice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reportgen.estimate.dtypes import Dtypes
from reportgen.estimate.libraries import CURRENT
from reportgen.model import ModelSpec


@dataclass(frozen=True)
class LogitsMemory:
    saved: int  # kept for backward until the loss's backward ran
    forward_live: int  # everything live at the loss in the forward pass (includes ``saved``)
    backward_live: int  # live during the loss's backward (replaces ``saved``)


#: torchtune's default ``num_output_chunks``
CHUNKS = 8


#: fp32 numbers per token a compiled cross-entropy saves beside its input: the row maximum and the
#: log-sum-exp (``tests/test_logits_compiled.py``)
COMPILED_ROW_STATS = 2


def loss_logits_memory(model: ModelSpec, dt: Dtypes, tokens: int, loss: str) -> LogitsMemory:
    """``logits_memory`` for a setup's ``loss`` value."""
    return logits_memory(model, dt, tokens, fused=loss == "fused", chunked=loss in ("chunked", "chunked-compiled"),
                         compiled=loss == "chunked-compiled", upcast=loss != "no-upcast")


def logits_memory(model: ModelSpec, dt: Dtypes, tokens: int, fused: bool = False,
                  chunked: bool = False, compiled: bool = False, upcast: bool = True) -> LogitsMemory:
    v, c = model.vocab_size, dt.compute
    if chunked and compiled:
        soft = c * v if model.final_logit_softcapping else 0
        saved = tokens * (c * v + 8 + 4 * COMPILED_ROW_STATS + soft)
        return LogitsMemory(saved=saved, forward_live=saved,
                            backward_live=saved + math.ceil(tokens / CHUNKS) * c * v)
    if not upcast and c != 4:
        soft = c * v if model.final_logit_softcapping else 0
        saved = tokens * (c * v + 8 + soft) + c  # + nll_loss's total_weight in the logits' dtype
        return LogitsMemory(saved=saved, forward_live=saved + tokens * c * v,
                            backward_live=tokens * (3 * c * v + soft + 8))
    if chunked:
        soft = c * v if model.final_logit_softcapping else 0
        saved = tokens * (4 * v + 8 + soft) + 4
        head_out = c * v if c != 4 else 0
        forward_live = saved + tokens * head_out + math.ceil(tokens / CHUNKS) * 4 * v
        backward_live = tokens * (4 * v + soft + 8) + math.ceil(tokens / CHUNKS) * (8 * v + c * v)
        return LogitsMemory(saved=saved, forward_live=forward_live, backward_live=backward_live)
    if fused:
        chunk = liger_chunk_tokens(tokens, v, model.hidden_size)
        work = chunk * v * c  # one chunk's logits, their gradient written in place (Liger 0.5.0 on; before, an fp32 copy too)
        grad_in = tokens * model.hidden_size * c  # grad of the hidden states, filled chunk by chunk
        head = v * model.hidden_size
        grad_w = head * dt.embed_bytes if dt.trainable_base else 0  # the head's gradient, zeroed before the loop
        temp = liger_grad_weight_traffic(head, c, dt.embed_bytes, dt.flce_in_place)[1] if dt.trainable_base else 0
        return LogitsMemory(saved=grad_in + grad_w, forward_live=grad_in + grad_w + work + temp,
                            backward_live=grad_in + grad_w)
    soft = c * v if model.final_logit_softcapping else 0
    saved = tokens * (4 * v + 8 + soft) + 4  # + nll_loss's fp32 total_weight
    head_out = c * v if c != 4 else 0  # with fp32 compute .float() returns the same tensor
    forward_live = saved + tokens * (head_out + 4 * v)
    backward_live = tokens * (12 * v + soft + 8)
    return LogitsMemory(saved=saved, forward_live=forward_live, backward_live=backward_live)


def kept_output_bytes(model: ModelSpec, dt: Dtypes, tokens: int, returned_fp32: bool, fused: bool) -> int:
    """The logits tensor a training loop that keeps its outputs holds (``keep_outputs``): fp32 when
    the model hands back upcast logits (``libraries.py``), else in the compute dtype; a fused
    linear-cross-entropy returns no logits."""
    if fused:
        return 0
    return tokens * model.vocab_size * (4 if returned_fp32 else dt.compute)


def liger_chunk_tokens(tokens: int | float, vocab: int, hidden: int) -> int:
    """Rows of one chunk of Liger's fused linear cross-entropy: ``next_power_of_2(cdiv(BT, cdiv(V, H)))``
    (``ops/fused_linear_cross_entropy.py``), so one chunk's logits are about as large as the hidden states."""
    inc = math.ceil(vocab / hidden)
    return 1 << max(0, math.ceil(math.log2(max(1, math.ceil(tokens / inc)))))


def liger_grad_weight_traffic(head: int, c: int, w: int, in_place: bool) -> tuple[int, int, int]:
    """Liger's fused linear cross-entropy sums the LM head's weight gradient over its chunks during the
    forward (``ops/fused_linear_cross_entropy.py``): ``(HBM bytes per chunk beyond the product's FLOPs,
    bytes of the transient, kernels per chunk beyond the GEMM)`` for a ``head = V x H`` weight stored in
    ``w`` bytes, products in ``c``;
    ``in_place``: the Liger version adds the product in the GEMM (``Libraries.flce_in_place``).

    * in place (``torch.addmm(..., out=grad_weight)``): the GEMM's epilogue reads and writes the
      gradient: ``2w`` bytes per element and chunk, no transient.
    * Liger 0.6.2 to 0.8.2 for a 16-bit head (and any version for an fp32 one with fp32 products):
      ``grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()``: the product (``c``
      bytes per element), its fp32 copy (``.float()`` reads ``c`` and writes 4; a no-op on fp32) and
      the in-place add (reads ``w`` and 4, writes ``w``): 14 bytes per element and chunk for bf16,
      with a transient of 6 (issue #1232; PR #1239 measured 3,072 MiB of extra peak for 131,072 x 4,096
      on an RTX 4090).

    The 0.8.x fp32 path needs torch 2.8 and, from 0.8.2 (PR #1316), compute capability 8.0 (Turing cards
    take the other path; not told apart). Up to 0.6.1 an fp32 head under autocast went through an fp32
    ``addmm`` of upcast products: counted as in place. The chunk rule (``liger_chunk_tokens``) is every
    release's for the models modelled here: a 16x wider budget (PR #1414) was set back to it by default
    before 0.8.3, which keeps a wider one for GPT-OSS only (PR #1472, the release notes'
    "workload-specific chunk sizing"). 0.8.3's reuse of one logits buffer and direct writes of the input
    gradient (PR #1468) are not modelled (the copy they save moves ``2 T H c`` bytes a micro-batch).

    Worked example (``tests/test_liger_loss.py``): Qwen2.5 1.5B in pure bf16 (``V x H`` = 151,936 x
    1,536) on Liger 0.6.4, 16 x 1,024 tokens make 64 chunks of 256 rows: 64 x 14 x 233.4 M = 209 GB a
    micro-batch, about 0.21 s on an RTX 4090's 1,008 GB/s, and a transient of 1.4 GB at the end of the
    forward; in place (0.8.3 on) 64 x 4 x 233.4 M = 60 GB."""
    if in_place:
        return 2 * w * head, 0, 0
    upcast = c != 4  # ``.float()`` of an fp32 product is the product itself: no kernel, no copy
    return head * ((c + 4) * upcast + 2 * w + 4), head * (c + 4 * upcast), 1 + upcast


def liger_head_note(model: ModelSpec, tokens: int) -> str:
    """What an estimate with Liger's fused loss and a trainable head says of the Liger version it prices
    (``liger_grad_weight_traffic``): the harness's, which sums the head's gradient inside its GEMM."""
    v, h = model.vocab_size, model.hidden_size
    n = math.ceil(tokens / liger_chunk_tokens(tokens, v, h))
    return (f"loss fused with a trainable LM head: priced as Liger-Kernel {CURRENT.liger_kernel} runs it (the "
            f"head's gradient summed inside its GEMM, chunk by chunk); Liger 0.6.2 to 0.8.2 add a {v:,} x {h:,} "
            f"product and its fp32 copy for each of a micro-batch's {n} chunks (14 bytes an element in bf16): "
            "slower than this estimate")
