"""Measure what autograd really saves for a tiny model (CPU), to pin the activation inventory."""

from __future__ import annotations

import contextlib
import weakref

TINY = {
    "llama": dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                  use_sliding_window=False),
    "mistral": dict(model_type="mistral", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, sliding_window=None,
                    tie_word_embeddings=False),
    "gemma2": dict(model_type="gemma2", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=32,
                   sliding_window=128, hidden_activation="gelu_pytorch_tanh"),
    "phi3": dict(model_type="phi3", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, sliding_window=None,
                 tie_word_embeddings=False, pad_token_id=0),
    "mixtral": dict(model_type="mixtral", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False),
    # families of issue 9; head_dim differs from hidden/heads where the family allows it
    "gemma": dict(model_type="gemma", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                  hidden_act="gelu_pytorch_tanh"),
    # sliding_window_pattern 2: layer 0 sliding, layer 1 full attention, i.e. two RoPE tables
    "gemma3": dict(model_type="gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=176,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   max_position_embeddings=256, query_pre_attn_scalar=32, sliding_window=128,
                   sliding_window_pattern=2, hidden_activation="gelu_pytorch_tanh"),
    "qwen3": dict(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                  tie_word_embeddings=False, use_sliding_window=False),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=256, hidden_size=64, intermediate_size=176,
                      moe_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, max_position_embeddings=256, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                      use_sliding_window=False),
    # resid_pdrop as Phi-2's: the attention and MLP outputs are dropped out in training
    "phi": dict(model_type="phi", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, partial_rotary_factor=0.5,
                resid_pdrop=0.1, embd_pdrop=0.0, attention_dropout=0.0, hidden_act="gelu_new", qk_layernorm=False,
                tie_word_embeddings=False),
    # Phi-4 is a phi3 model with grouped KV heads (40 query, 10 KV heads)
    "phi3_gqa": dict(model_type="phi3", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, sliding_window=None,
                     tie_word_embeddings=False, pad_token_id=0),
    "olmo2": dict(model_type="olmo2", vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False),
}


def saved_bytes(cfg: dict, method: str, precision: str, attn: str, ckpt: bool, batch: int, seq: int,
                rank: int = 8, targets: str = "qv", layers: int | None = None) -> dict[str, int]:
    """Run one forward pass and return bytes of tensors saved for backward by category."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    kw = dict(cfg)
    if layers is not None:
        kw["num_hidden_layers"] = layers
    model_type = kw.pop("model_type")
    config = AutoConfig.for_model(model_type, **kw)
    config.use_cache = False  # as the measuring harness builds it (``measure/build.py`` ``hf_config``)
    if method == "full":
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    else:
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    if method != "full":
        from peft import LoraConfig, get_peft_model

        from reportgen.measure.build import lora_target_modules
        from reportgen.model import from_config

        names = lora_target_modules(from_config({**kw, "model_type": model_type}, name="tiny"), targets)
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=names, lora_dropout=0.0),
                               autocast_adapter_dtype=precision != "bf16")
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    param_shapes = {tuple(p.shape) for p in model.parameters()}
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq))
    seen = _saved_storages(model, ids, autocast=precision == "bf16-mixed",
                           sdpa_math=attn == "sdpa" and cuda_sdpa_is_math(cfg, precision, method))
    weights = sum(n for n, shape, dt in seen.values() if shape in param_shapes and dt == torch.bfloat16
                  and precision == "bf16-mixed")
    total = sum(n for n, _, _ in seen.values())
    return {"total": total, "autocast_weights": weights, "activations": total - weights}


@contextlib.contextmanager
def cuda_autocast_view():
    """peft's bitsandbytes LoRA layer asks ``torch.is_autocast_enabled()``, which reports *CUDA*
    autocast. On CUDA under ``torch.autocast("cuda")`` it is true; on this CPU test it would be
    false although CPU autocast is on. Make that one module see CPU autocast, so the CPU run takes
    the code path a CUDA run takes (``tuners/lora/bnb.py`` ``requires_conversion``)."""
    import peft.tuners.lora.bnb as peft_bnb
    import torch

    class _TorchView:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def is_autocast_enabled(device_type=None):
            return torch.is_autocast_enabled(device_type or "cpu")

    real = peft_bnb.torch
    peft_bnb.torch = _TorchView()
    try:
        yield
    finally:
        peft_bnb.torch = real


@contextlib.contextmanager
def cuda_autocast_policy():
    """Run CPU autocast with CUDA autocast's policy for the ops where the two differ in these models.

    CUDA autocast runs ``layer_norm`` and ``pow`` in fp32 (PyTorch AMP docs, "CUDA Ops that can
    autocast to float32"; ``aten/src/ATen/autocast_mode.cpp`` ``KERNEL_CUDA(layer_norm, fp32)``,
    ``KERNEL_CUDA(pow, Tensor_Scalar, fp32)``): every floating argument is cast to fp32 (not cached)
    and the op runs with autocast off. CPU autocast leaves both in the input's dtype. Phi-2's
    ``nn.LayerNorm`` and ``NewGELUActivation`` (``torch.pow(x, 3.0)``) meet them with 16-bit inputs;
    the other families only call ``pow`` on fp32 tensors. The estimator models CUDA, so the CPU run
    registers the same policy for the AutocastCPU key while the forward pass runs."""
    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def fp32(t):
        return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return torch.ops.aten.layer_norm(fp32(input), normalized_shape, fp32(weight), fp32(bias), eps,
                                             cudnn_enable)

    def pow_tensor_scalar(self, exponent):
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return torch.ops.aten.pow.Tensor_Scalar(fp32(self), exponent)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("layer_norm", layer_norm, "AutocastCPU")
    lib.impl("pow.Tensor_Scalar", pow_tensor_scalar, "AutocastCPU")
    try:
        yield
    finally:
        lib._destroy()


def saved_bytes_harness(cfg: dict, name: str, setup, alive_at_end: bool = False) -> int:
    """Bytes saved for backward by one forward pass of the model the measuring harness builds
    (``reportgen.measure.build``: QLoRA through bitsandbytes' CPU backend, LoRA dropout).
    ``alive_at_end``: only what the graph still holds when the forward returns (DoRA saves tensors in
    a graph it drops within the layer's forward, whose freed storages the CPU allocator reuses)."""
    import torch

    from reportgen.measure.build import build
    from reportgen.model import from_config

    model = build(from_config(dict(cfg), name=name), setup, "cpu").model
    torch.manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (setup.batch, setup.seq))
    with cuda_autocast_view():
        seen = _saved_storages(model, ids, autocast=setup.precision.value == "bf16-mixed", alive_at_end=alive_at_end,
                               sdpa_math=cuda_sdpa_is_math(cfg, setup.precision.value, setup.method.value))
    return sum(nbytes for nbytes, _, _ in seen.values())


def cuda_sdpa_is_math(cfg: dict, precision: str, method: str) -> bool:
    """Whether CUDA's SDPA takes the math path for this tiny model (``activations.sdpa_kernel``: fp32
    inputs of a grouped-query model, torch 2.11). The CPU's flash kernel accepts grouped-query
    fp32 inputs (torch 2.13), so the CPU run is held to the math path there, as CUDA runs it."""
    from reportgen.estimate.activations import sdpa_kernel
    from reportgen.estimate.dtypes import dtypes_for
    from reportgen.model import from_config
    from reportgen.setup import TrainingSetup

    spec = from_config(dict(cfg), name="tiny")
    setup = TrainingSetup(method=method, precision=precision, seq=24)
    return sdpa_kernel(spec, setup, dtypes_for(setup).compute) == "math"


def _saved_storages(model, ids, autocast: bool, alive_at_end: bool = False,
                    sdpa_math: bool = False) -> dict[int, tuple[int, tuple, object]]:
    """One training forward pass (loss included) under ``saved_tensors_hooks``: every storage
    autograd saves that is not a parameter, once, as ``{data_ptr: (bytes, shape, dtype)}``;
    ``alive_at_end``: only those still saved in the graph of the returned loss."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, tuple, object]] = {}
    packed: list = []

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            if alive_at_end:
                packed.append((weakref.ref(t), st.data_ptr(), (st.nbytes(), tuple(t.shape), t.dtype)))
            else:
                seen.setdefault(st.data_ptr(), (st.nbytes(), tuple(t.shape), t.dtype))
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    policy = cuda_autocast_policy() if autocast else contextlib.nullcontext()
    if sdpa_math:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = sdpa_kernel(SDPBackend.MATH)
    else:
        backend = contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx, policy, backend:
        out = model(input_ids=ids, labels=ids)
    for ref, ptr, info in packed:  # the graph of ``out`` still holds these
        if ref() is not None:
            seen.setdefault(ptr, info)
    del out
    return seen
