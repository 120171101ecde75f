"""`reportgen measure` on a real NVIDIA GPU (skipped without CUDA): the memory figures exist and
are ordered as PyTorch and the driver define them, the cap, the snapshot, the CUDA-event step times
and the profile's device figures, a real OOM, and every
recipe of the validation sweep on a small model (the smoke test scripts/validate_on_gpu.sh runs
with SMOKE=1 before it spends the GPU's time on the sweep)."""

import importlib.util
import json
import os

import pytest

from reportgen.cli import main
from tests.torch_saved import TINY


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _cuda(), reason="needs an NVIDIA GPU with CUDA")]
FAST = ["--gpu", "h100-sxm", "--batch", "2", "--seq", "128", "--warmup", "1", "--steps", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny-llama.json"
    path.write_text(json.dumps(TINY["llama"]))
    return str(path)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The tiny Llama with a 32k vocabulary: its embedding and head (2M elements) are large enough
    for bitsandbytes to page their states (>= 1e5 elements) and torchao to offload them."""
    path = tmp_path_factory.mktemp("cfg") / "small-llama.json"
    path.write_text(json.dumps(dict(TINY["llama"], vocab_size=32768)))
    return str(path)


def measure_json(capsys, *args):
    rc = main(["measure", *args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_memory_figures_on_cuda(capsys, tiny, method):
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--method", method)
    assert rc == 0, d["error"]
    m, env = d["measurement"], d["environment"]
    for key in ("peak_allocated", "peak_reserved", "memory_after_load"):
        assert isinstance(m[key], int) and m[key] > 0, key
    assert m["peak_reserved"] >= m["peak_allocated"] >= m["memory_after_load"]
    if m["device_used_source"] == "nvml-process":
        assert m["device_used"] > m["peak_reserved"]  # the driver also counts the CUDA context
    assert env["gpu_name"] and env["gpu_total_bytes"] > 0 and env["cuda_version"]
    assert env["driver_version"]
    if env["gpu_catalog_key"]:
        assert 0 < m["mfu"] < 1 and m["mfu_basis"]["gpu"] == env["gpu_catalog_key"]
    else:
        assert m["mfu"] is None


def test_cap_emulates_a_smaller_card(capsys, tiny):
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--gpu", "t4", "--cap-to-gpu")
    assert rc == 0, d["error"]
    cap = d["cap"]
    assert cap["emulated_gpu"] == "t4" and cap["applied"] is True
    assert 0 < cap["fraction"] < 1
    assert cap["limit_bytes"] == pytest.approx(cap["fraction"] * cap["device_total_bytes"], rel=1e-9)
    assert cap["limit_bytes"] < 16 * 2**30


def test_snapshot(capsys, tiny, tmp_path):
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--snapshot", str(tmp_path))
    assert rc == 0, d["error"]
    path = d["measurement"]["snapshot"]
    assert path and os.path.getsize(path) > 0 and path.endswith(".pickle")


def test_cuda_event_times_and_adaptive_steps(capsys, tiny):
    """Each timed step's CUDA-event time (start and end events on the current stream, inside the
    synchronized wall-time window) is positive and not above its wall time; the rule ran at least
    the minimum and says why it stopped."""
    import statistics

    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--method", "lora", "--max-timed-s", "1")
    assert rc == 0, d["error"]
    m = d["measurement"]
    assert len(m["step_times_cuda_s"]) == len(m["step_times_s"]) == m["steps_run"] >= 2
    assert m["stop_reason"] in ("stable", "max_steps", "time_cap")
    for wall, event in zip(m["step_times_s"], m["step_times_cuda_s"]):
        assert 0 < event <= wall + 1e-4
    assert m["step_s_cuda"] == statistics.median(m["step_times_cuda_s"])
    assert m["step_s"] == statistics.median(m["step_times_s"])  # tokens/s stays on the wall time


def test_profile_on_cuda(capsys, tiny, tmp_path):
    """--profile on CUDA: per profiled step the GPU-busy time (union of the device's intervals) is
    positive and within the step's wall time, kernels and launches are counted, and the trace holds
    the kernels."""
    from reportgen.measure.trace_stats import read_trace

    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--method", "lora", "--profile", str(tmp_path))
    assert rc == 0, d["error"]
    p = d["measurement"]["profile"]
    assert p["error"] is None and p["activities"] == ["cpu", "cuda"] and len(p["steps"]) == 2
    for step in p["steps"]:
        assert 0 < step["gpu_busy_s"] <= 1.05 * step["wall_s"]
        assert step["kernels"] > 0 and step["launches"] > 0 and step["aten_ops"] >= step["aten_ops_top"] > 0
    assert any(e.get("cat") == "kernel" for e in read_trace(p["trace"]))


def test_real_oom_under_a_cap(capsys, tiny):
    """Eager attention over 16k tokens materialises batch x heads x seq^2 scores: far beyond 16 GiB."""
    rc, d = measure_json(capsys, "--model", tiny, "--gpu", "t4", "--cap-to-gpu", "--attn", "eager",
                         "--batch", "8", "--seq", "16384", "--warmup", "1", "--steps", "1")
    assert rc == 1
    assert d["status"] == "oom"
    assert "out of memory" in d["error"].lower()


#: (flags, distributions it needs beside torch/transformers/peft)
RECIPES = [
    (["--method", "full", "--precision", "bf16", "--optimizer", "adamw-8bit"], ["bitsandbytes"]),
    (["--method", "full", "--precision", "bf16", "--optimizer", "paged-adamw-8bit"], ["bitsandbytes"]),
    (["--method", "full", "--precision", "bf16", "--optimizer", "adafactor"], []),
    (["--method", "full", "--precision", "bf16", "--optimizer", "sgd", "--accum", "2"], []),
    (["--method", "full", "--precision", "bf16-mixed", "--offload", "optimizer"], ["torchao"]),
    (["--method", "full", "--precision", "bf16-mixed", "--grad-ckpt"], []),
    (["--method", "lora", "--precision", "fp16-mixed"], []),
    (["--method", "lora", "--precision", "fp32"], []),
    (["--method", "lora", "--precision", "bf16", "--attn", "eager"], []),
    (["--method", "qlora", "--quant", "fp4"], ["bitsandbytes"]),
    (["--method", "qlora", "--double-quant", "--grad-ckpt", "--optimizer", "paged-adamw-8bit"], ["bitsandbytes"]),
    (["--method", "lora", "--loss", "fused"], ["liger_kernel"]),
    (["--method", "qlora", "--loss", "fused", "--grad-ckpt"], ["bitsandbytes", "liger_kernel"]),
]


@pytest.mark.parametrize("flags,needs", RECIPES, ids=[" ".join(f).replace("--", "") for f, _ in RECIPES])
def test_recipes_on_cuda(capsys, small, flags, needs):
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    rc, d = measure_json(capsys, "--model", small, *FAST, *flags)
    assert rc == 0, d["error"]
    m = d["measurement"]
    assert m["loss_finite"] is True, m.get("final_loss")
    assert m["peak_reserved"] >= m["peak_allocated"] >= m["memory_after_load"] > 0
    assert m["step_s"] > 0 and m["params_trainable"] > 0
    if "fused" in flags:
        assert "loss: Liger-Kernel fused linear cross-entropy" in m["notes"]
    if "paged-adamw-8bit" in flags:
        assert any("managed memory" in n for n in m["notes"])
    assert d["cap"] is None  # not asked for


def test_no_cap_for_the_card_itself(capsys, tiny):
    """A case whose --gpu is the measuring card is not capped (sweeps set cap_to_gpu for every case)."""
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--cap-to-gpu")
    assert rc == 0, d["error"]
    if d["environment"]["gpu_catalog_key"] == "h100-sxm":
        assert d["cap"]["applied"] is False and d["cap"]["fraction"] is None
