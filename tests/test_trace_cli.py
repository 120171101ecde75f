"""``reportgen trace`` from the command line: the JSON a user or the site reads, an architecture the
estimator does not know, and the errors a user can make."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reportgen.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    from tests.torch_saved import TINY

    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(TINY["llama"]))
    return str(path)


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_every_field_of_estimate_and_is_labelled_traced(capsys, tiny_llama):
    pytest.importorskip("torch")
    flags = ["--model", tiny_llama, "--gpu", "rtx-4090", "--method", "lora", "--seq", "64", "--format", "json"]
    code, out, _ = _run(capsys, "estimate", *flags)
    assert code == 0
    estimated = json.loads(out)
    code, out, _ = _run(capsys, "trace", *flags)
    assert code == 0
    traced = json.loads(out)
    # the whole run's phases (estimate/run.py) are the estimate's alone: a trace runs one step
    assert set(estimated) - {"run", "verdict_phase"} <= set(traced)
    assert set(estimated["memory"]) == set(traced["memory"])
    assert traced["kind"] == "traced" and traced["trace_hash"] and traced["verdict"] in ("fits", "does not fit")
    assert traced["setup"] == estimated["setup"]
    assert traced["params"] == estimated["params"]
    # the time model priced on what the traced step dispatched (trace/work.py), not a measured time
    t = traced["time"]
    assert t["step_s"] > 0 and t["work"]["forward"]["kernels"] > 0
    assert t["work"]["forward"]["kernels"] != estimated["time"]["work"]["forward"]["kernels"] or \
        t["work"]["forward"]["bytes"] != estimated["time"]["work"]["forward"]["bytes"]  # counted, not copied
    assert {"forward", "loss-backward", "optimizer-step"} <= set(traced["timeline"])
    assert all({"name", "what", "source"} <= set(e) for e in traced["emulations"])


def test_an_architecture_without_analytic_formulas_gets_a_traced_answer(capsys):
    pytest.importorskip("torch")
    config = str(FIXTURES / "gpt-neox-scaled.json")
    code, _, err = _run(capsys, "estimate", "--model", config, "--gpu", "rtx-4090")
    assert code == 2 and "gpt_neox" in err  # the estimator refuses the family
    code, out, _ = _run(capsys, "trace", "--model", config, "--gpu", "rtx-4090", "--method", "lora", "--seq", "128",
                        "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["kind"] == "traced" and d["model_type"] == "gpt_neox" and d["analytic_family"] is False
    assert any("no analytic formulas" in n for n in d["notes"])
    assert d["memory"]["peak_allocated"] > d["memory"]["weights"] > 0


def test_opt_config_traces_with_its_dropout_and_qlora(capsys):
    pytest.importorskip("bitsandbytes")
    code, out, _ = _run(capsys, "trace", "--model", str(FIXTURES / "opt-125m.json"), "--gpu", "rtx-4090",
                        "--method", "qlora", "--seq", "64", "--format", "json")
    assert code == 0
    names = {e["name"] for e in json.loads(out)["emulations"]}
    assert {"cuda_fused_dropout", "bnb_quantize_on_meta", "bnb_gemm_4bit_dequant"} <= names


def test_table_output_names_the_numbers_as_traced(capsys, tiny_llama):
    pytest.importorskip("torch")
    code, out, _ = _run(capsys, "trace", "--model", tiny_llama, "--gpu", "rtx-4090", "--seq", "32")
    assert code == 0
    assert "traced" in out and "peak reserved" in out and "emulations applied" in out


@pytest.mark.parametrize("argv,message", [
    (["--gpus", "2", "--sharding", "ddp"], "gpus=2"),
    (["--offload", "optimizer"], "offload=optimizer"),
    (["--optimizer", "paged-adamw-8bit"], "managed memory"),
    (["--warmup", "0"], "--warmup"),
])
def test_setups_the_tracer_cannot_run_are_user_errors(capsys, tiny_llama, argv, message):
    code, out, err = _run(capsys, "trace", "--model", tiny_llama, "--gpu", "rtx-4090", *argv)
    assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err and out == ""


def test_unknown_model_and_missing_lora_targets_are_user_errors(capsys):
    code, _, err = _run(capsys, "trace", "--model", "llama-9b", "--gpu", "rtx-4090")
    assert code == 2 and "unknown model" in err
    pytest.importorskip("torch")
    code, _, err = _run(capsys, "trace", "--model", str(FIXTURES / "gpt-neox-scaled.json"), "--gpu", "rtx-4090",
                        "--method", "lora", "--lora-targets", "qv", "--seq", "32")
    assert code == 2 and "all-linear" in err


def test_without_torch_the_error_names_the_extra_to_install():
    script = ("import sys; sys.modules['torch'] = None; from reportgen.cli import main; "
              "sys.exit(main(['trace', '--model', 'tinyllama-1.1b', '--gpu', 'rtx-4090']))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert 'pip install -e ".[measure]"' in proc.stderr and "Traceback" not in proc.stderr


def test_the_cli_does_not_import_torch_to_build_its_parser():
    script = "import sys; from reportgen.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False"


def test_a_trace_that_fits_only_by_releasing_the_cache_says_how_much(monkeypatch, tiny_llama):
    """When the unlimited replay does not fit the card, the step is replayed limited to it; if that
    succeeds, the JSON's memory says what the allocator gave back (cache_released), the figures are the
    limited replay's, and the site compares them with the estimate's card-limited reserved."""
    pytest.importorskip("torch")
    import dataclasses

    from reportgen import catalog
    from reportgen.model import from_config
    from reportgen.setup import TrainingSetup
    from reportgen.trace import replay as R
    from reportgen.trace.result import trace_case
    from reportgen.traced_results import cache_limited

    real, extra = R.replay, 2**40  # the unlimited replay made to need a tebibyte more than the card

    def replay(run, limit_bytes=None):
        r = real(run, limit_bytes)
        return r if limit_bytes else dataclasses.replace(r, peak_reserved=r.peak_reserved + extra)

    monkeypatch.setattr(R, "replay", replay)
    spec = from_config(json.loads(Path(tiny_llama).read_text()), name="tiny")
    t = trace_case(spec, catalog.load_gpu("rtx-4090"), TrainingSetup(method="lora", seq=64))
    memory = t.as_dict()["memory"]
    assert t.fits and memory["cache_released"] == extra
    assert memory["device_total"] <= catalog.load_gpu("rtx-4090").memory_bytes  # the limited replay's figures
    assert any("fits only because the allocator releases" in n for n in t.notes)
    assert cache_limited({"memory": memory}) and not cache_limited({"memory": {"cache_released": 0}})


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_the_answer_is_not_buried_under_library_warnings(tiny_llama, method):
    """Issue 19: seven lines of torchao, torch and transformers warnings came before the answer; and
    the traced step is the one after warm-up, not a "measured" one. Issue 35: bitsandbytes 0.50's
    "Failed to load CPU gemm_4bit_forward from kernels-community" (logged at import on a CPU with
    AVX512-BF16, for LoRA too since peft imports bitsandbytes) stays out of it (trace/quiet.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    proc = subprocess.run([sys.executable, "-m", "reportgen", "trace", "--model", tiny_llama, "--gpu", "rtx-4090",
                           "--method", method, "--seq", "32"], capture_output=True, text=True, cwd=ROOT,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
    assert proc.stdout.startswith(tiny_llama)  # the answer comes first
    assert "measured step" not in proc.stdout
