"""Pieces of the measuring side that need no subprocess: the device-to-catalog rule for MFU, the
shard and hopeless-case rules, the refusals, the OOM path (injected), the terminal view."""

import pytest

from reportgen.errors import UserError
from reportgen.measure.environment import catalog_gpu_for, light_environment
from reportgen.measure.protocol import MEASUREMENT_KEYS, MeasureRequest, answer, empty_measurement
from reportgen.measure.runner import hopeless, parse_shard
from reportgen.setup import TrainingSetup
from reportgen.sweep import Case
from tests.torch_saved import TINY

GIB = 2**30


@pytest.mark.parametrize("name,total_gib,key", [
    ("NVIDIA H100 80GB HBM3", 79.6, "h100-sxm"),
    ("NVIDIA H100 PCIe", 79.6, "h100-pcie"),
    ("NVIDIA H200", 140.0, "h200"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb"),
    ("NVIDIA A100 80GB PCIe", 79.2, "a100-80gb"),
    ("Tesla T4", 14.6, "t4"),
    ("NVIDIA L4", 22.0, "l4"),
    ("NVIDIA A10G", 22.0, "a10g"),
    ("NVIDIA GeForce RTX 4090", 23.6, "rtx-4090"),
    ("NVIDIA GeForce RTX 3090 Ti", 23.6, "rtx-3090-ti"),
    ("NVIDIA GeForce RTX 3060", 11.8, "rtx-3060"),
    # cards added for issue 9, names as the cited CUDA/NVML outputs print them (see each catalog entry):
    # NVIDIA/gpu-admin-tools#4 and akash-network/provider-configs#91; pytorch/ao#4002 and
    # NVIDIA/TensorRT-LLM#10278; nanoporetech/dorado#459 and akash-network/provider-configs#99;
    # ObrienlabsDev/machine-learning gpus.md; thamada/nvidia-smi; noonghunna/club-3090#617;
    # Dr-Noob/gpufetch#60 (the 8 GB 4060 Ti under the same name); runpod/docs references/gpu-types.mdx
    ("NVIDIA H100 NVL", 93.0, "h100-nvl"),
    ("NVIDIA B200", 178.35, "b200"),
    ("NVIDIA L40S", 44.4, "l40s"),
    ("NVIDIA RTX A6000", 47.4, "rtx-a6000"),
    ("NVIDIA RTX 6000 Ada Generation", 47.5, "rtx-6000-ada"),
    ("NVIDIA GeForce RTX 5090", 31.4, "rtx-5090"),
    ("NVIDIA GeForce RTX 4060 Ti", 15.6, "rtx-4060-ti-16gb"),
    # cards added for issue 30, names as CUDA/NVML print them (utkuozdemir/nvidia_gpu_exporter's RTX 4080 SUPER
    # capture, geerlingguy/raspberry-pi-pcie-devices#791, noonghunna/club-3090#353, mayooot/detect-gpu#3,
    # NVIDIA/open-gpu-kernel-modules#1159, madMAx43v3r/chia-gigahorse#364, zzc0721/torch-performance-test-data)
    ("NVIDIA GeForce RTX 4080", 16.0, "rtx-4080"),
    ("NVIDIA GeForce RTX 4080 SUPER", 16.0, "rtx-4080-super"),
    ("NVIDIA GeForce RTX 3080", 10.0, "rtx-3080"),
    ("NVIDIA GeForce RTX 3080", 12.0, "rtx-3080-12gb"),  # the same name for the 12 GB card (384-bit bus)
    ("NVIDIA GeForce RTX 5080", 15.9, "rtx-5080"),
    ("NVIDIA GeForce RTX 5070 Ti", 15.9, "rtx-5070-ti"),
    ("NVIDIA GeForce RTX 5060 Ti", 15.9, "rtx-5060-ti-16gb"),
    ("NVIDIA RTX A4000", 16.0, "rtx-a4000"),
    ("NVIDIA RTX A5000", 24.0, "rtx-a5000"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 95.6, "rtx-pro-6000"),
    ("NVIDIA TITAN RTX", 23.7, "titan-rtx"),
    ("NVIDIA A10", 22.5, "a10"),
    # NVIDIA/nvidia-docker#1760 (nvidia-smi -q: "NVIDIA GeForce RTX 2080 Ti"); #1146 on an older driver
    ("NVIDIA GeForce RTX 2080 Ti", 10.7, "rtx-2080-ti"),
    ("GeForce RTX 2080 Ti", 10.7, "rtx-2080-ti"),
    # look-alikes that are other silicon, other memory or other limits: not in the catalog
    ("NVIDIA GeForce RTX 3080", None, None),  # size unknown: 10 GB or 12 GB, do not guess
    ("NVIDIA GeForce RTX 5060 Ti", 7.6, None),  # the 8 GB card
    ("NVIDIA GeForce RTX 3080 Ti", 12.0, None),
    ("NVIDIA GeForce RTX 4070 Ti", 12.0, None),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", 16.0, None),  # no entry yet: its boost clock and L2 were not citable
    ("NVIDIA RTX 5000 Ada Generation", 32.0, None),  # no entry yet: its L2 was not citable
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 95.6, None),
    ("NVIDIA RTX 5000 Ada Generation Laptop GPU", 16.0, None),
    ("NVIDIA GeForce RTX 2080", 7.8, None),  # TU104, not the catalog's TU102 card
    ("NVIDIA GeForce RTX 2080 SUPER", 7.8, None),
    ("NVIDIA GeForce RTX 4060 Ti", 7.6, None),  # the 8 GB card
    ("NVIDIA GeForce RTX 4060 Ti", None, None),  # size unknown: do not guess
    ("NVIDIA GeForce RTX 3060", 7.6, None),  # the 8 GB RTX 3060 (128-bit bus)
    ("NVIDIA GeForce RTX 5090 D", 31.4, None),
    ("NVIDIA GeForce RTX 5090 Laptop GPU", 23.5, None),
    ("NVIDIA GeForce RTX 4090 D", 23.6, None),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", 15.6, None),
    ("NVIDIA GeForce RTX 3060 Laptop GPU", 5.8, None),
    ("NVIDIA L40", 44.4, None),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 94.5, None),
    ("Quadro RTX 6000", 23.6, None),
    ("NVIDIA H200 NVL", 139.8, None),
    ("NVIDIA GB200", 184.0, None),
    (None, None, None),
])
def test_device_names_map_to_catalog_cards(name, total_gib, key):
    assert catalog_gpu_for(name, None if total_gib is None else int(total_gib * GIB)) == key


def test_every_device_pattern_names_a_catalog_card():
    from reportgen import catalog
    from reportgen.hardware import _DEVICE_PATTERNS

    keys = [key for key, _, _ in _DEVICE_PATTERNS]
    assert set(keys) == set(catalog.gpu_names())


def test_light_environment_needs_no_torch():
    env = light_environment()
    assert env["source"] == "parent" and env["gpu_name"] is None
    assert env["utc"].endswith("+00:00")
    assert "torch" in env["versions"]
    assert isinstance(env["cuda_env"], dict)  # PYTORCH_CUDA_ALLOC_CONF & co. change what is reserved


def test_light_environment_records_allocator_settings(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    env = light_environment()
    assert env["cuda_env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "CUDA_MODULE_LOADING" not in env["cuda_env"]


@pytest.mark.parametrize("text,expected", [(None, (0, 1)), ("0/3", (0, 3)), ("2/3", (2, 3))])
def test_parse_shard(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_parse_shard_rejects(text):
    with pytest.raises(UserError):
        parse_shard(text)


def test_hopeless_only_beyond_twice_the_card():
    case = Case(model="llama-3.1-8b", gpu="rtx-4090", setup=TrainingSetup())
    card = 24 * GIB
    assert hopeless(case, {"estimate": {"memory": {"peak_allocated": int(1.9 * card)}}}) is None
    assert "2x" in hopeless(case, {"estimate": {"memory": {"peak_allocated": int(2.1 * card)}}})
    assert hopeless(case, {"estimate": None}) is None  # no estimate: measure it


def test_unsupported_setups_are_refused_with_a_reason():
    from reportgen.measure.harness import check_supported
    from reportgen.measure.optimizers import SetupNotSupported

    with pytest.raises(SetupNotSupported, match="needs 2 GPUs"):
        check_supported(TrainingSetup(gpus=2, sharding="ddp"), "cpu")
    with pytest.raises(SetupNotSupported, match="offload=params"):
        check_supported(TrainingSetup(offload="params"), "cpu")
    with pytest.raises(SetupNotSupported, match="need a CUDA device"):
        check_supported(TrainingSetup(loss="fused"), "cpu")
    check_supported(TrainingSetup(loss="fused"), "cuda")  # Liger's kernels run there


def test_answer_shape():
    req = MeasureRequest(model="llama-3.2-1b", gpu="t4", setup=TrainingSetup().model_dump(mode="json"))
    a = answer(req, "ok", measurement=empty_measurement())
    assert set(a) == {"status", "measurement", "error", "environment", "cap", "case"}
    assert set(a["measurement"]) == set(MEASUREMENT_KEYS)
    assert a["case"]["model"] == "llama-3.2-1b"


def test_injected_oom_is_an_oom_result(monkeypatch, tmp_path):
    """The harness in this process (no subprocess): torch.OutOfMemoryError in a step -> status oom
    with torch's message, and the figures it could not measure stay null."""
    import json

    from reportgen.measure import harness

    path = tmp_path / "tiny-llama.json"
    path.write_text(json.dumps(TINY["llama"]))
    monkeypatch.setenv(harness.FAULT_ENV, "oom")
    setup = TrainingSetup(method="lora", batch=1, seq=16).model_dump(mode="json")
    req = MeasureRequest(model=str(path), gpu="rtx-4090", setup=setup, device="cpu", warmup=1, steps=1)
    out = harness.run(req, environment={"device": "cpu"})
    assert out["status"] == "oom"
    assert "Tried to allocate" in out["error"]
    m = out["measurement"]
    assert m["failed_in"] == "warmup" and m["fault_injected"] == "oom"
    assert m["step_s"] is None and m["peak_allocated"] is None


def test_oom_classification():
    import torch

    from reportgen.measure.harness import is_oom

    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


def _printed(status: str, failed_in: str, error: str) -> str:
    """What ``print_measurement`` shows of a failed run of the default setup, as text."""
    from rich.console import Console

    from reportgen.views.measurement import print_measurement

    req = MeasureRequest(model="llama-3.2-1b", gpu="rtx-4090", setup=TrainingSetup().model_dump(mode="json"))
    result = answer(req, status, measurement=dict(empty_measurement(), failed_in=failed_in), error=error,
                    environment=light_environment())
    console = Console(record=True, width=160)
    print_measurement(result, None, console=console)
    return console.export_text()


def test_table_view_of_a_failed_measurement():
    text = _printed("oom", "timed", "CUDA out of memory. Tried to allocate 3.91 GiB")
    assert "status: oom (in timed)" in text and "Tried to allocate" in text
    assert "peak allocated" in text and "estimated (rtx-4090" in text
    # the parent's light environment names no device: the run is labelled, compared with nothing
    assert "run on an unrecorded device: not comparable; compares with the estimate: nothing" in text


def test_a_measurement_refused_in_setup_prints_no_empty_table():
    """``reportgen measure`` where no CUDA device is visible printed a table of dashes before its error."""
    text = _printed("error", "setup", "--device cuda: no CUDA device is visible to PyTorch")
    assert "status: error (in setup)" in text and "no CUDA device is visible" in text
    assert "peak allocated" not in text and "compares with the estimate" not in text


class _FakeNvml:
    def __init__(self, used):
        self.used = used

    def process_used(self):
        return (self.used, "nvml-process") if self.used is not None else (None, "unavailable")


@pytest.fixture()
def fake_cuda(monkeypatch):
    """torch.cuda as _cap sees it on an H100 80GB (CUDA total 79.2 GiB), recording the fraction set."""
    import types

    import torch

    calls = []
    props = types.SimpleNamespace(total_memory=85_030_000_000, name="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2 * 2**20)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    return calls


def _request(gpu):
    return MeasureRequest(model="llama-3.1-8b", gpu=gpu, setup=TrainingSetup().model_dump(mode="json"),
                          cap_to_gpu=True)


def test_cap_emulates_a_smaller_card_with_the_measured_context(fake_cuda):
    from reportgen import catalog
    from reportgen.measure.harness import _cap

    cap = _cap(_request("rtx-4090"), _FakeNvml(600 * 2**20), "h100-sxm")
    card = catalog.load_gpu("rtx-4090").memory_bytes
    assert cap["applied"] is True and cap["context_bytes"] == 598 * 2**20  # NVML's figure less the allocator's
    assert cap["limit_bytes"] == card - 598 * 2**20
    assert fake_cuda == [(cap["limit_bytes"] / 85_030_000_000, 0)]
    assert isinstance(fake_cuda[0][0], float) and 0 < fake_cuda[0][0] < 1  # torch refuses anything else


def test_cap_without_nvml_assumes_the_context(fake_cuda):
    from reportgen.estimate.constants import CUDA_CONTEXT_BYTES
    from reportgen.measure.harness import _cap

    for nvml in (None, _FakeNvml(None)):  # no NVML at all; NVML without this process's figure
        cap = _cap(_request("rtx-4090"), nvml, "h100-sxm")
        assert cap["applied"] is True and cap["context_bytes"] == CUDA_CONTEXT_BYTES
        assert cap["context_source"].startswith("assumed")


def test_no_cap_on_the_card_itself_or_a_bigger_one(fake_cuda):
    """h100-sxm cases on an H100: the catalog's nvidia-smi total (81559 MiB) is above CUDA's total
    less the context, which would have set a meaningless fraction of ~0.99."""
    from reportgen.measure.harness import _cap

    cap = _cap(_request("h100-sxm"), _FakeNvml(600 * 2**20), "h100-sxm")
    assert cap["applied"] is False and cap["fraction"] is None and "emulated card" in cap["note"]
    cap = _cap(_request("h200"), _FakeNvml(600 * 2**20), "h100-sxm")
    assert cap["applied"] is False and "no more memory" in cap["note"]
    assert fake_cuda == []


def test_fused_loss_refused_when_liger_does_not_patch(monkeypatch):
    """Liger returns silently for a model type it has no kernels for: the case must not run the
    standard loss recorded as fused."""
    import sys
    import types

    from reportgen.measure.build import _fuse_cross_entropy
    from reportgen.measure.optimizers import SetupNotSupported

    def lce_forward(self, *args, **kwargs):
        return None

    lce_forward.__module__ = "liger_kernel.transformers.model.llama"
    fake = types.ModuleType("liger_kernel.transformers")
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)

    class Model:
        config = types.SimpleNamespace(model_type="llama")

        def forward(self):
            return None

    fake._apply_liger_kernel_to_instance = lambda model, **kw: None  # an unsupported model type
    with pytest.raises(SetupNotSupported, match="did not patch"):
        _fuse_cross_entropy(Model(), [])

    def patch(model, **kw):
        model.forward = types.MethodType(lce_forward, model)

    fake._apply_liger_kernel_to_instance = patch
    notes = []
    _fuse_cross_entropy(Model(), notes)
    assert notes == ["loss: Liger-Kernel fused linear cross-entropy"]


def test_worker_exit_skips_the_interpreter_teardown():
    """After the answer is written the worker ends at once, even with a helper thread still running
    (a hung Triton/NCCL thread or a broken CUDA context would otherwise hold it until the timeout)."""
    import subprocess
    import sys

    code = ("import threading, time; threading.Thread(target=time.sleep, args=(600,)).start(); "
            "from reportgen.measure.worker import _exit_now; print('answer written'); _exit_now(0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "answer written" in proc.stdout


def test_the_worker_iterates_sets_in_the_same_order_on_every_run(monkeypatch):
    """The worker's environment fixes the hash seed: a set of strings (Gemma 3's layer types, whose
    order is its allocation order) iterates alike in two workers, whatever seed the parent has."""
    import subprocess
    import sys

    from reportgen.measure.isolate import _worker_env

    code = "print(list({'sliding_attention', 'full_attention', 'a', 'b', 'c', 'd', 'e', 'f'}))"
    orders = set()
    for seed in ("1", "2", "random"):
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        orders.add(subprocess.run([sys.executable, "-c", code], env=_worker_env(), capture_output=True, text=True,
                                  check=True).stdout)
    assert len(orders) == 1
    monkeypatch.setenv("PYTHONHASHSEED", "random")  # the same code without the worker's environment varies
    assert len({subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
                for _ in range(4)}) > 1
