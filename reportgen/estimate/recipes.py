"""What the training code around the model adds to the step (``TrainingSetup.recipe``).

``loop`` is the measuring harness's plain PyTorch loop (``measure/step.py``), which every other
module models. ``trainer`` is transformers' ``Trainer`` (5.x, as Axolotl runs it) and ``trl-sft``
TRL 1.16.0's ``SFTTrainer`` on top of it. Term by term, from their source:

* **Loss and logits** (``trl-sft`` only). ``SFTTrainer.__init__`` patches the model with
  ``add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))``
  (``trl/trainer/sft_trainer.py`` 1143-1147) and ``compute_loss`` calls
  ``model(**inputs, fused_lm_head=True)`` (1604): the backbone's last hidden state is shifted, the
  positions whose label is not -100 are gathered (``hidden_states[mask]``, the compact path on
  CUDA, ``trl/trainer/utils.py`` ``_fused_forward``) and ``ChunkedLogProbFunction``
  (``trl/kernels/chunked_logprob.py``) projects them through ``lm_head.weight`` in tiles of
  ``TOKEN_CHUNK_SIZE = 4096`` tokens x ``chunk_size = 32768`` vocabulary entries
  (``_CHUNKED_LOGPROB_CHUNK_SIZE``) into one reused buffer ``mm_buf`` in the compute dtype, folding
  each tile into per-token fp32 statistics (a Triton kernel on CUDA, allocating nothing). The full
  ``tokens x vocab`` logits never exist, so none of ``logits.py``'s fp32 terms do. What does
  (``trl_head_memory``): the gathered hidden states (saved for backward, in the residual stream's
  dtype), the int64 targets, seven fp32 per-token accumulators in the forward, the saved
  ``log_z`` and ``entropy`` (fp32), the tile buffer, a compute-dtype copy of each token chunk and
  of each vocabulary chunk of the weight when their dtypes differ from the compute dtype
  (``.to(compute_dtype)``, not autocast's cached cast: ``P.autocast_copy_bytes_head`` and the
  frozen head's cast are gone), and in the backward an fp32 ``grad_hidden`` (and, when the head is
  trained, an fp32 ``grad_weight`` that becomes its gradient), the tile buffer again, and at its
  ``return`` ``grad_hidden.to(hidden.dtype)`` then ``grad_weight.to(weight.dtype)``: each a new tensor
  when that dtype is not fp32 (bf16 weights: the head's V x h gradient twice, fp32 and bf16), made
  while the fp32 accumulators, ``mm_buf`` and the last chunks' casts are still the function's locals
  (``trl_head_backward_bytes``). The entropy and token-accuracy metrics (``compute_loss``
  1638-1644) come out of the same pass (``entropy`` is saved, ``is_top1`` one byte per token); their
  ``.item()`` calls add no device memory. ``lm_head``'s module is never called, so its input is not
  saved (``activations.fixed_activations(head_module=False)``).
* **QLoRA adapters in bf16** (``trl-sft``): on a quantized model every trainable parameter but DoRA's
  magnitude is cast to bf16 (``sft_trainer.py`` 904-911), so adapters, their gradients and AdamW's
  states are 2 bytes (``dtypes.py``). No ``prepare_model_for_kbit_training`` and no
  ``peft_module_casting_to_bf16`` in TRL 1.16 (neither is called by ``trl/trainer/sft_trainer.py``;
  only ``trl/experimental/orpo`` still imports them): the unquantized weights stay in the dtype the
  model was loaded in (``setup.kbit`` defaults to ``none`` under ``trl-sft``).
* **No term (the same as the loop)**: gradient checkpointing is non-reentrant in both (transformers
  >= 5 ``activation_checkpointing_enable`` defaults to ``{"use_reentrant": False}``,
  ``modeling_utils.py``; TRL sets it only for transformers < 5, ``sft_trainer.py`` 1079-1081); PEFT +
  checkpointing calls ``enable_input_require_grads`` as the harness does (``sft_trainer.py`` 899-900);
  ``Trainer.create_optimizer`` splits the trainable parameters into a weight-decay and a no-decay
  group (``trainer.py``) of ``adamw_torch_fused`` (the default ``optim`` for torch >= 2.8): the same
  states per parameter, one fused kernel per group; ``training_step`` returns the loss only (the
  outputs die before the backward: ``keep_outputs`` none) and ``zero_grad`` sets gradients to None.
  Packing and padding-free batches are ``padding``/``seq_mean`` (``lengths.py``), for every recipe.

* **torchtune's model** (``setup.modeling`` torchtune: the ``TransformerDecoder`` torchtune 0.6.1's builders
  make, run by its own recipes, whose loop is the harness's). Three differences from transformers' modeling,
  each from torchtune's source: its attention copies k and v to every query head before SDPA
  (``modules/attention.py`` ``MultiHeadAttention.forward``: ``k.unsqueeze(2).expand(...).flatten(1, 2)``),
  which SDPA saves (``activations.sdpa_kv_repeated``); its padded batches carry no attention mask
  (``data/_collate.py`` ``padded_collate_sft`` returns tokens and labels only; the causal kernel runs,
  padding is ignored by the loss's -100 labels); and its RoPE caches are fp32 buffers built at the
  builder's ``max_seq_len`` (``rope_cache_bytes``). Traced against torchtune's own recipe on meta
  (``reportgen trace --recipe torchtune``, ``trace/torchtune_recipe.py``).

Torch-free, like the rest of the estimator.
"""

from __future__ import annotations

from reportgen.estimate.dtypes import Dtypes
from reportgen.estimate.logits import LogitsMemory
from reportgen.model import ModelSpec
from reportgen.setup import Method, Modeling, Recipe, TrainingSetup

#: ``trl/kernels/chunked_logprob.py`` ``TOKEN_CHUNK_SIZE``: tokens per tile
TRL_TOKEN_CHUNK = 4096
#: ``trl/trainer/utils.py`` ``_CHUNKED_LOGPROB_CHUNK_SIZE``: vocabulary entries per tile
TRL_VOCAB_CHUNK = 32768
#: the per-token fp32 accumulators ``ChunkedLogProbFunction.forward`` allocates before its loop
#: (running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit)
TRL_ACCUMULATORS = 7


def fused_head(setup: TrainingSetup) -> bool:
    """Whether the recipe computes the loss with TRL's fused LM head instead of the model's: SFTTrainer,
    and GRPOTrainer, which patches the policy with ``add_fused_lm_head(..., outputs=("log_probs",
    "entropy"))`` (``trl/trainer/grpo_trainer.py`` 1068-1072) and calls ``model(..., fused_lm_head=True)``
    for every log-prob it needs (``_get_per_token_logps_and_entropies``, 1496-1498)."""
    return setup.recipe in (Recipe.trl_sft, Recipe.grpo)


def trl_scored_tokens(setup: TrainingSetup, tokens: int) -> int:
    """Positions the fused head scores: each row's last token has no next-token label (``labels[:, 1:]``);
    every other label is valid in the worst case (no -100 besides padding). GRPO labels the completion
    only (``labels[:, :-logits_to_keep] = -100``, ``grpo_trainer.py`` 1496, ``logits_to_keep`` the
    completion length): ``max_completion_length`` positions per row."""
    if setup.recipe == Recipe.grpo:
        return setup.batch * setup.max_completion_length
    return max(0, tokens - setup.batch)


def trl_head_memory(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, tokens: int) -> LogitsMemory:
    """TRL 1.16's fused LM head (``add_fused_lm_head`` + ``ChunkedLogProbFunction``), see the module
    docstring. ``saved``: what the function keeps for backward; ``forward_live``: its live memory in
    the tile loop (or right after it, whichever is larger); ``backward_live``: in the backward's tile
    loop or at its return, whichever is larger (``trl_head_backward_bytes``)."""
    n, h, v, c = trl_scored_tokens(setup, tokens), model.hidden_size, model.vocab_size, dt.compute
    hb = dt.stream  # the last hidden state: the final norm returns the residual stream's dtype
    wb = dt.embed_bytes if setup.method != Method.full else dt.base  # lm_head.weight (or the tied embedding)
    tile_rows = min(n, TRL_TOKEN_CHUNK)
    tile = tile_rows * min(v, TRL_VOCAB_CHUNK) * c  # mm_buf
    casts = (tile_rows * h * c if hb != c else 0) + (min(v, TRL_VOCAB_CHUNK) * h * c if wb != c else 0)
    mask = tokens - setup.batch  # the bool label mask, kept by masked_scatter's backward
    gathered = n * h * hb + 8 * n  # hidden_states[mask] and labels[mask], saved by ctx
    saved = gathered + 4 * n + 4 * n + mask  # + log_z and entropy
    accumulators = TRL_ACCUMULATORS * 4 * n
    # after the loop: log_z, logprobs, entropy (fp32) and is_top1 (bool) beside the accumulators
    forward_live = gathered + mask + accumulators + max(tile + casts, 13 * n)
    back = trl_head_backward_bytes(model, setup, dt, n, tile + 4 * n)  # + the fp32 incoming gradient of log_probs
    return LogitsMemory(saved=saved, forward_live=forward_live, backward_live=saved + back)


def trl_head_backward_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, n: int, loop: int) -> int:
    """Peak of ``ChunkedLogProbFunction.backward`` (``trl/kernels/chunked_logprob.py``, TRL 1.16) above
    what the forward saved, for ``n`` scored tokens; ``loop``: ``mm_buf`` and the incoming fp32 gradient
    of ``log_probs``, alive from the first tile to the return. It allocates ``grad_hidden`` (N x h) and,
    when the head is trained (full fine-tuning; tied or not), ``grad_weight`` (V x h), both fp32 zeros,
    then recomputes each tile: ``hidden_chunk = hidden[...].to(compute_dtype)`` and ``w_chunk =
    weight[start:end].to(compute_dtype)`` are copies only when their dtype differs, and as named locals
    each new one is made before the previous one is let go (two vocabulary chunks' casts at once from the
    second chunk on, two token chunks' past 4,096 tokens). Its ``return`` evaluates
    ``grad_hidden.to(hidden.dtype)`` then ``grad_weight.to(weight.dtype)`` while every local is still
    alive (the fp32 accumulators, ``mm_buf``, the last chunks' casts); each ``.to`` is a new tensor
    unless the dtype is already fp32. The peak is the loop's or the return's. Llama 3.2 1B full bf16,
    8 x 160 tokens: the return's 0.49 GiB bf16 copy of the 128,256 x 2,048 head gradient beside the fp32
    one is what the traced step (``reportgen trace --recipe trl-sft``) peaks on (``aten._to_copy``)."""
    h, v, c, hb = model.hidden_size, model.vocab_size, dt.compute, dt.stream
    wb = dt.embed_bytes if setup.method != Method.full else dt.base
    trained = setup.method == Method.full
    fp32_grads = n * h * 4 + (v * h * 4 if trained else 0)
    row = h * c if hb != c else 0  # a hidden chunk's cast, per token
    col = h * c if wb != c else 0  # a weight chunk's cast, per vocabulary entry
    rows, cols = min(n, TRL_TOKEN_CHUNK), min(v, TRL_VOCAB_CHUNK)
    last_rows = n - (max(n - 1, 0) // TRL_TOKEN_CHUNK) * TRL_TOKEN_CHUNK  # the last token chunk
    last_cols = v - ((v - 1) // TRL_VOCAB_CHUNK) * TRL_VOCAB_CHUNK  # the last vocabulary chunk
    new_cols = cols + min(max(v - TRL_VOCAB_CHUNK, 0), TRL_VOCAB_CHUNK)  # w_chunk 1 made while 0 is bound
    new_rows = rows + min(max(n - TRL_TOKEN_CHUNK, 0), TRL_TOKEN_CHUNK)  # hidden_chunk 1 while 0 is bound
    in_loop = max(rows * row + new_cols * col, new_rows * row + last_cols * col)
    copies = (n * h * hb if hb != 4 else 0) + (v * h * wb if trained and wb != 4 else 0)
    return fp32_grads + loop + max(in_loop, last_rows * row + last_cols * col + copies)


__all__ = ["TRL_ACCUMULATORS", "TRL_TOKEN_CHUNK", "TRL_VOCAB_CHUNK", "fused_head", "trl_head_backward_bytes",
           "trl_head_memory", "trl_scored_tokens"]


#: model types (the Hub config's) whose torchtune builders make one RoPE module per attention layer
#: (``models/qwen2/_component_builders.py``: ``qwen2`` / ``lora_qwen2`` build ``Qwen2RotaryPositionalEmbeddings``
#: inside the per-layer loop); the others build one and share it (``models/llama3_2/_component_builders.py``)
ROPE_PER_LAYER_MODEL_TYPES = ("qwen2",)


def rope_cache_bytes(model: ModelSpec, setup: TrainingSetup) -> int:
    """The RoPE buffers torchtune's model keeps on the GPU (0 under transformers, whose ``inv_freq`` is a few
    hundred bytes). ``RotaryPositionalEmbeddings`` / ``Llama3ScaledRoPE.build_rope_cache``
    (``modules/position_embeddings.py``, ``models/llama3_1/_position_embeddings.py``): ``theta`` of
    ``head_dim / 2`` fp32 values (``.float()``) and ``cache = stack([cos, sin], -1)`` of
    ``max_seq_len x head_dim / 2 x 2`` fp32; ``Qwen2RotaryPositionalEmbeddings``
    (``models/qwen2/_positional_embeddings.py``): ``cat([cos, sin], -1)`` of ``freqs = cat([idx_theta, idx_theta])``,
    ``max_seq_len x 2 head_dim`` fp32, one per layer (``ROPE_PER_LAYER_MODEL_TYPES``). ``max_seq_len`` is the
    builder's (``setup.rope_positions``, which ``configs/torchtune.py`` reads from the builder's source: Llama 3.2
    131,072; Qwen2.5 7B base 131,072, instruct 32,768), else the model config's ``max_position_embeddings``.
    Worked example (``tests/test_torchtune_modeling.py``): Llama 3.2 1B, head_dim 64: 32 x 4 + 131,072 x 64 x 4 = 33,554,560 bytes."""
    if setup.modeling != Modeling.torchtune:
        return 0
    hd, positions = model.head_dim, setup.rope_positions or model.max_position_embeddings
    theta = hd // 2 * 4
    if model.model_type in ROPE_PER_LAYER_MODEL_TYPES:
        return model.num_layers * (theta + positions * 2 * hd * 4)
    return theta + positions * hd * 4
