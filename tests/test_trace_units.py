"""The tracer's parts on small, hand-checkable cases: the CUDA autocast policy, SDPA's kernel choice,
the recorder's events, and whole traces whose parameter-side terms are known exactly."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from reportgen import catalog  # noqa: E402
from reportgen.estimate import constants as K  # noqa: E402
from reportgen.estimate import params as P  # noqa: E402
from reportgen.estimate.dtypes import dtypes_for  # noqa: E402
from reportgen.model import from_config  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402
from reportgen.trace.autocast import CudaAutocastPolicy  # noqa: E402
from reportgen.trace.emulations import EMULATIONS, Applied, autocast_as_cuda  # noqa: E402
from reportgen.trace.functions import CudaFunctions  # noqa: E402
from reportgen.trace.kernels import sdpa_backend  # noqa: E402
from reportgen.trace.recorder import ALIAS, ALLOC, FREE, Recorder  # noqa: E402
from reportgen.trace.result import trace_case  # noqa: E402
from tests.torch_saved import TINY  # noqa: E402

F = torch.nn.functional
META = "meta"


def tiny(fam: str = "llama"):
    return from_config(dict(TINY[fam]), name=f"tiny-{fam}")


# ----- CUDA autocast on meta --------------------------------------------------------------------
@pytest.fixture
def cuda_autocast():
    policy = CudaAutocastPolicy()
    with autocast_as_cuda(Applied(), policy), CudaFunctions(policy, lambda name: None):
        yield policy


def test_linear_runs_in_bf16_and_the_weight_cast_is_cached_until_autocast_exits(cuda_autocast):
    w = torch.nn.Parameter(torch.empty(8, 4, device=META))
    x = torch.empty(2, 4, device=META)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y1, _second = F.linear(x, w), F.linear(x, w)  # the second call hits the cast cache
        assert y1.dtype == torch.bfloat16
        hit = cuda_autocast._cache[id(w)][1]
        assert F.linear(x, w).dtype == torch.bfloat16 and cuda_autocast._cache[id(w)][1] is hit
    assert cuda_autocast._cache == {}  # autocast_mode.cpp: the cache dies with the outermost region


def test_fp32_ops_and_output_dtype_ops_follow_cudas_lists(cuda_autocast):
    x = torch.empty(2, 4, device=META, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.exp(x).dtype == torch.float32  # AT_FORALL_FP32
        assert F.softmax(x, dim=-1).dtype == torch.float32  # FP32_SET_OPT_DTYPE, no dtype given
        assert F.softmax(x, dim=-1, dtype=torch.bfloat16).dtype == torch.bfloat16  # a given dtype wins
        assert (x * 2).dtype == torch.bfloat16  # not in any list
        assert F.layer_norm(x, (4,)).dtype == torch.float32
    assert torch.exp(x).dtype == torch.bfloat16  # autocast off: untouched


def test_autocast_disabled_region_and_cuda_state_queries(cuda_autocast):
    w = torch.empty(8, 4, device=META)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
        with torch.autocast(device_type="meta", enabled=False):  # what peft/transformers open
            assert F.linear(torch.empty(2, 4, device=META), w).dtype == torch.float32
    assert not torch.is_autocast_enabled()


# ----- SDPA kernel choice -------------------------------------------------------------------------
def _qkv(dtype, d=64, kv_heads=2):
    return (torch.empty(1, 8, 16, d, device=META, dtype=dtype), torch.empty(1, kv_heads, 16, d, device=META, dtype=dtype),
            torch.empty(1, kv_heads, 16, d, device=META, dtype=dtype))


@pytest.mark.parametrize("dtype,mask,d,kv_heads,gqa,expected", [
    (torch.bfloat16, False, 64, 2, True, "flash"),  # 16-bit, no mask, head dim <= 256: FlashAttention-2 (GQA)
    (torch.float16, False, 256, 8, False, "flash"),
    (torch.bfloat16, False, 64, 2, False, "math"),  # fewer k/v heads without enable_gqa: no fused kernel
    (torch.bfloat16, True, 64, 8, False, "efficient"),  # flash takes no mask (transformers repeats k/v)
    (torch.float32, False, 64, 8, False, "efficient"),  # flash is 16-bit only
    (torch.float32, False, 64, 2, True, "math"),  # and the memory-efficient kernel refuses GQA (torch 2.11)
    (torch.bfloat16, False, 512, 8, False, "efficient"),  # head dim > 256
    (torch.float32, False, 62, 8, False, "math"),  # head dim not a multiple of 4 (fp32 GEMM alignment)
])
def test_sdpa_backend_follows_select_sdp_backend(dtype, mask, d, kv_heads, gqa, expected):
    q, k, v = _qkv(dtype, d, kv_heads)
    attn_mask = torch.empty(1, 1, 16, 16, device=META, dtype=torch.bool) if mask else None
    assert sdpa_backend(q, k, v, attn_mask, 0.0, enable_gqa=gqa) == expected


# ----- the recorder -------------------------------------------------------------------------------
def test_recorder_sees_allocations_and_frees_but_not_views():
    rec = Recorder()
    with rec:
        a = torch.empty(256, device=META)  # 1 KiB
        b = a.view(16, 16)  # a view: no allocation
        c = a * 2  # a new 1 KiB storage
        del a
        del b  # a's storage dies with its last view
        del c
    kinds = [(k, rec.storages[x].nbytes) for k, x in rec.events]
    assert kinds == [(ALLOC, 1024), (ALLOC, 1024), (FREE, 1024), (FREE, 1024)]
    assert rec.storages[1].op == "aten.mul.Tensor"


def test_gradient_sums_are_replayed_in_place_as_on_cuda():
    """``y`` feeds two products, so its two gradients meet in the engine's input buffer: on CUDA
    ``old.add_(new)``, on meta ``old + new`` (meta counts as a tensor subclass)."""
    x = torch.empty(1024, device=META, requires_grad=True)
    rec = Recorder()
    with rec:
        rec.set_phase("forward")
        y = x * 2
        z = (y * 3 + y * 4).sum()
        rec.set_phase("loss-backward")
        z.backward()
    assert rec.inplace_accumulations == 1
    assert sum(1 for k, _ in rec.events if k == ALIAS) == 1


# ----- whole traces with known parameter-side terms ----------------------------------------------------
H100 = catalog.load_gpu("h100-sxm")


def _param_bytes(spec, setup):
    return P.weights_bytes(spec, setup, dtypes_for(setup))


def test_full_finetuning_terms_are_the_models_own_bytes():
    """fp32 full fine-tuning with AdamW: weights and the two states are exact multiples of the
    parameter count (plus one fp32 device step per parameter tensor for fused AdamW)."""
    spec = tiny()
    setup = TrainingSetup(method="full", precision="fp32", batch=2, seq=64)
    d = trace_case(spec, H100, setup).as_dict()
    n_tensors = spec.num_layers * (7 + 2) + 1 + 2  # 7 linears + 2 norms per layer, final norm, embed, head
    assert d["params"]["total"] == spec.total_params
    assert d["at_peak"]["weights"] == 4 * spec.total_params
    assert d["at_peak"]["optimizer"] == 2 * 4 * spec.total_params + 4 * n_tensors
    assert d["memory"]["cublas_workspace"] == K.CUBLAS_HANDLES * K.CUBLAS_WORKSPACE_HOPPER


def test_lora_and_qlora_parameter_terms_match_the_libraries():
    spec = tiny()
    for method in ("lora", "qlora"):
        for dq in (False, True):
            setup = TrainingSetup(method=method, double_quant=dq, lora_rank=8, batch=1, seq=32)
            at = trace_case(spec, H100, setup).replay.at_peak
            assert at["lora_adapters"] == P.adapter_bytes(spec, setup, dtypes_for(setup))
            assert at["weights"] == _param_bytes(spec, setup)  # the model's buffers are counted apart
            assert at.get("quant_constants", 0) == P.quant_constants_bytes(spec, setup)


def test_json_totals_are_consistent_and_labelled_traced():
    spec = tiny("phi3")
    tr = trace_case(spec, H100, TrainingSetup(method="lora", lora_dropout=0.1, batch=2, seq=64))
    d = tr.as_dict()
    mem = d["memory"]
    assert d["kind"] == "traced" and d["fits"] is True
    assert mem["device_total"] == mem["peak_reserved"] + K.CUDA_CONTEXT_BYTES
    assert mem["peak_reserved"] >= mem["peak_allocated"] >= sum(d["at_peak"].values())
    assert max(d["timeline"].values()) == mem["peak_allocated"]
    assert d["peak_phase"] in d["timeline"]
    names = [e["name"] for e in d["emulations"]]
    assert {"cuda_autocast_policy", "sdpa_flash", "cuda_fused_dropout", "cublas_workspace", "cuda_context"} <= set(names)
    assert all(e["source"] for e in d["emulations"]) and set(names) <= set(EMULATIONS)


def test_a_card_too_small_is_an_out_of_memory_in_the_replay():
    small = dataclasses.replace(catalog.load_gpu("rtx-4090"), nvidia_smi_total_mib=math.ceil(K.CUDA_CONTEXT_BYTES / 2**20) + 8)
    tr = trace_case(tiny(), small, TrainingSetup(method="lora", batch=1, seq=32))
    assert tr.fits is False
    assert any("out of memory" in n for n in tr.notes)


def test_one_warm_up_step_reaches_the_steady_state():
    setup = TrainingSetup(method="full", precision="bf16-mixed", batch=2, seq=64, accum=2)
    one, two = (trace_case(tiny(), H100, setup, warmup=w).replay for w in (1, 2))
    assert (one.peak_allocated, one.peak_reserved) == (two.peak_allocated, two.peak_reserved)
