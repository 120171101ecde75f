"""`reportgen measure` end to end on CPU: the JSON contract, the recipes on a tiny Llama, and every
failure path (timeout, crash) answered by the parent, which never imports torch. A worker's error
(a config torch cannot build, with its traceback) is checked in test_measure_sweep.py's GPU-script
test, which measures that config anyway."""

import json
import subprocess
import sys
import textwrap

import pytest

from reportgen.cli import main
from reportgen.measure.protocol import MEASUREMENT_KEYS
from tests.measure_helpers import measure_json, tiny_config

ENV_KEYS = {"device", "gpu_name", "gpu_total_bytes", "driver_version", "cuda_version", "versions", "python",
            "reportgen", "git_commit", "hostname", "utc"}
FAST = ["--gpu", "h100-sxm", "--device", "cpu", "--batch", "2", "--seq", "32", "--warmup", "1", "--steps", "2",
        "--max-steps", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_config(tmp_path_factory.mktemp("cfg")))


def check_ok_on_cpu(d: dict) -> dict:
    assert d["status"] == "ok", d["error"]
    assert d["error"] is None and d["cap"] is None
    m = d["measurement"]
    assert set(MEASUREMENT_KEYS) <= set(m)
    for key in ("step_s", "step_s_min", "step_s_max", "tokens_per_s"):
        assert isinstance(m[key], float) and m[key] > 0, key
    assert m["step_s_min"] <= m["step_s"] <= m["step_s_max"]
    assert len(m["step_times_s"]) == 2 and all(t > 0 for t in m["step_times_s"])
    assert len(m["gc_collections"]) == len(m["gc_pause_s"]) == 2  # per timed step (timing.GcPauses)
    # the CPU cannot say how much GPU memory a run needs: null, never a guess; no catalog CPU peak: no MFU
    for key in ("peak_allocated", "peak_reserved", "device_used", "memory_after_load", "mfu"):
        assert m[key] is None, key
    assert m["loss_finite"] is True
    env = d["environment"]
    assert ENV_KEYS <= set(env) and env["device"] == "cpu" and env["source"] == "worker"
    assert {"torch", "transformers", "peft", "bitsandbytes", "accelerate", "torchao"} <= set(env["versions"])
    assert env["versions"]["torch"]
    return m


def test_full_json_contract_and_parent_never_imports_torch(tiny):
    """Run the CLI in a fresh interpreter: the measurement happens in the worker, the CLI process
    ends without torch (so without any CUDA state) in sys.modules."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from reportgen.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["measure", "--model", {tiny!r}, *{FAST!r}, "--format", "json"])
        print(json.dumps({{"rc": rc, "answer": json.loads(buf.getvalue()), "torch": "torch" in sys.modules}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["torch"] is False
    assert out["rc"] == 0
    d = out["answer"]
    m = check_ok_on_cpu(d)
    assert d["case"]["setup"]["method"] == "full" and d["case"]["gpu"] == "h100-sxm"
    assert m["storage_dtype"] == "fp32" and m["compute_dtype"] == "bf16"  # bf16-mixed: fp32 master weights
    from reportgen import catalog

    assert m["params_trainable"] == catalog.load_model(tiny).total_params


def test_lora_on_variable_lengths(capsys, tiny):
    """LoRA on q and v with checkpointing, on padded, masked micro-batches (--seq-mean): the adapters'
    parameters and dtypes, and tokens/s counting the data tokens only (one worker for both: each
    start imports torch, transformers and peft, about 9 s here)."""
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--method", "lora", "--lora-targets", "qv",
                         "--lora-rank", "4", "--grad-ckpt", "--seq-mean", "8", "--batch", "4")
    assert rc == 0
    m = check_ok_on_cpu(d)
    from reportgen import catalog
    from reportgen.estimate.params import lora_params
    from reportgen.setup import TrainingSetup

    setup = TrainingSetup(method="lora", lora_targets="qv", lora_rank=4)
    assert m["params_trainable"] == lora_params(catalog.load_model(tiny), setup)
    assert (m["storage_dtype"], m["adapter_dtype"]) == ("bf16", "fp32")
    assert m["tokens_per_step"] == 4 * 32
    assert 8 <= m["real_tokens_per_step"] < 4 * 32  # the first step holds one full 32-token sample
    assert m["tokens_per_s"] == pytest.approx(m["real_tokens_per_step"] / m["step_s"])


def test_qlora(capsys, tiny):
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--method", "qlora", "--double-quant", "--precision", "bf16")
    if d["status"] == "error" and "bitsandbytes" in (d["error"] or "") and "NotImplemented" in (d["error"] or ""):
        pytest.skip("bitsandbytes' CPU backend cannot train 4-bit layers here: " + d["error"].splitlines()[-1])
    assert rc == 0
    m = check_ok_on_cpu(d)
    assert (m["storage_dtype"], m["adapter_dtype"]) == ("bf16", "bf16")  # pure bf16: adapters too


def test_timeout(capsys, tiny):
    rc, d = measure_json(capsys, "--model", tiny, *FAST[:-4], "--steps", "1000000", "--max-timed-s", "1e9",
                         "--timeout", "2")
    assert rc == 1
    assert d["status"] == "timeout"
    assert "2 s" in d["error"]
    assert d["measurement"]["step_s"] is None
    assert ENV_KEYS <= set(d["environment"])  # from the worker's interim answer, or the parent's own


def test_a_crashing_worker_does_not_take_the_parent_down(capsys, monkeypatch, tiny):
    monkeypatch.setenv("REPORTGEN_FAULT", "crash")  # test-only: the worker SIGKILLs itself
    rc, d = measure_json(capsys, "--model", tiny, *FAST)
    assert rc == 1
    assert d["status"] == "error"
    assert "SIGKILL" in d["error"]


@pytest.mark.parametrize("args,needle", [
    (["--snapshot", "snaps"], "--snapshot"),
    (["--cap-to-gpu"], "--cap-to-gpu"),
    (["--steps", "0"], "--steps"),
    (["--gpus", "2"], "sharding"),
])
def test_bad_flags_exit_2_without_measuring(capsys, tiny, args, needle):
    assert main(["measure", "--model", tiny, "--gpu", "t4", "--device", "cpu", *args]) == 2
    assert needle in capsys.readouterr().err
