"""Issue 29, classes 5 and 6: messages that said something untrue or unhelpful, each now saying what
happened and what to do (exit 2 before anything runs), and the spreadsheet-formula leak of the CSVs."""

from __future__ import annotations

import csv
import io

import pytest

from reportgen.cli import main

ONE = ["--model", "llama-3.2-1b", "--gpu", "h100-sxm", "--device", "cpu"]


def _err(capsys) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


@pytest.mark.parametrize("argv, needle", [
    (["measure", *ONE, "--max-timed-s", "nan"], "--max-timed-s nan: must be a positive number of seconds"),
    (["measure", *ONE, "--timeout", "inf"], "--timeout inf: must be a positive number of seconds"),
    (["measure", *ONE, "--gpus", "2", "--sharding", "zero2"],
     "cannot measure this setup: sharding='zero2' is estimated only"),
])
def test_measure_refuses_before_running(monkeypatch, capsys, argv, needle):
    from reportgen.measure import cli

    monkeypatch.setattr("reportgen.measure.isolate.run_case", lambda *a: pytest.fail("it ran"))
    assert cli is not None and main(argv) == 2
    assert needle in _err(capsys)


def test_profile_into_an_unwritable_place_fails_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("reportgen.measure.isolate.run_case", lambda *a: pytest.fail("it ran"))
    (tmp_path / "afile").write_text("x")
    assert main(["measure", *ONE, "--profile", str(tmp_path / "afile" / "p")]) == 2
    assert f"--profile {tmp_path / 'afile' / 'p'}: cannot be written" in _err(capsys)


def test_ctrl_c_in_measure_does_not_claim_anything_was_saved(monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("reportgen.measure.isolate.run_case", interrupted)
    assert main(["measure", *ONE]) == 130
    err = _err(capsys)
    assert "interrupted: nothing was written" in err and "saved" not in err


@pytest.mark.parametrize("argv", [["cards", "--out", "{f}/x.json"], ["render", "--results", "{r}", "--docs", "{f}/docs"]])
def test_a_file_in_the_way_of_an_output_folder_is_named(tmp_path, capsys, argv):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "results").mkdir()
    argv = [a.format(f=tmp_path / "afile", r=tmp_path / "results") for a in argv]
    assert main(argv) == 2
    err = _err(capsys)
    assert f"{tmp_path / 'afile'} is a file, not a folder" in err and "File exists" not in err


def _sweep(tmp_path, text: str) -> int:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return main(["sweep", str(path), "--no-render", "--results", str(tmp_path / "results")])


def test_from_null_says_no_config_is_named(tmp_path, capsys):
    assert _sweep(tmp_path, "name: s\ngrids:\n  - from: null\n    gpu: rtx-4090\n") == 2
    err = _err(capsys)
    assert "s.yaml:3: from: names no config file (got null)" in err and "None" not in err


def test_a_sweeps_hint_names_the_grid_key_not_a_flag(tmp_path, capsys):
    (tmp_path / "c.yml").write_text("base_model: meta-llama/Llama-3.2-1B\nfsdp: [full_shard]\n")
    assert _sweep(tmp_path, "name: s\ngrids:\n  - from: c.yml\n    gpu: h100-sxm\n") == 2
    err = _err(capsys)
    assert "`gpus: N` in the grid" in err and "--gpus" not in err


def test_exclude_sees_the_values_a_from_config_gives(tmp_path, capsys):
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "configs"
    (tmp_path / "q.yml").write_text((fixtures / "axolotl_qlora.yml").read_text())
    text = ("name: s\ngrids:\n  - from: q.yml\n    gpu: h100-sxm\n  - model: llama-3.2-1b\n    gpu: h100-sxm\n"
            "exclude:\n  - method: qlora\n")
    assert _sweep(tmp_path, text) == 0
    files = sorted(p.name for p in (tmp_path / "results" / "s").glob("*.json"))
    assert files and not any(".qlora." in f for f in files) and "matches no cell" not in _err(capsys)


def test_a_cell_that_starts_like_a_formula_is_text_in_the_csv(monkeypatch):
    from reportgen.report import pages

    monkeypatch.setattr(pages, "csv_row", lambda r, terms: {k: r.get(k, "") for k in pages.CSV_COLUMNS})
    text = pages.write_csv([{"model": "=HYPERLINK(\"http://x\")", "case_id": "+1", "seq_tokens": -5,
                             "sweep": "@SUM(A1)", "gpu": "-2+3"}])
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["model"].startswith("'=") and row["case_id"] == "'+1" and row["sweep"] == "'@SUM(A1)"
    assert row["gpu"] == "'-2+3" and row["seq_tokens"] == "-5"  # a number stays a number


def test_a_setup_that_does_not_fit_says_so_beside_its_speed_and_points_to_advise(capsys):
    """Issue 31: 'does not fit' printed tokens/s as if the step ran, '-' where the calculator says
    'none fits', and no pointer to what would make it fit."""
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--batch", "4",
                 "--seq", "2048"]) == 0
    out = _err(capsys)
    assert "does not fit: needs" in out and "time if it fit (it does not" in out
    assert "largest micro-batch that fits at seq 2,048: none fits" in out
    assert "reportgen advise --model llama-3.1-8b --gpu rtx-4090 --seq 2048" in out
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "h100-sxm", "--method", "lora"]) == 0
    out = _err(capsys)
    assert "reportgen advise" not in out and "time if it fit" not in out


def test_the_moe_qlora_note_says_what_the_kbit_preparation_does_to_the_experts():
    """Issue 31: MoE QLoRA needed twice LoRA's cards while the note said the experts stay 16-bit. peft's
    prepare_model_for_kbit_training casts them to fp32 (they are not 4-bit); the note says so and how
    to keep them 16-bit, and the weights follow it."""
    from reportgen import catalog
    from reportgen.estimate import estimate
    from reportgen.setup import TrainingSetup

    model, gpu = catalog.load_model("mixtral-8x7b"), catalog.load_gpu("h100-sxm")
    prepared = estimate(model, gpu, TrainingSetup(method="qlora"), reverse=False)
    plain = estimate(model, gpu, TrainingSetup(method="qlora", kbit_prep="none"), reverse=False)
    assert any("casts them to fp32" in n and "--kbit-prep none" in n for n in prepared.notes)
    assert any("they stay 16-bit" in n for n in plain.notes)
    assert prepared.memory.terms["weights"] > 1.9 * plain.memory.terms["weights"]


def test_piped_sweep_output_is_never_wrapped_inside_a_line(tmp_path):
    """Issue 31: piped output of reportgen sweep wrapped at 80 columns, in the middle of a number."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / ("a-long-folder-name-" * 4) / "results"
    proc = subprocess.run([sys.executable, "-m", "reportgen", "sweep", str(root / "tests/fixtures/sweeps/tiny.yaml"),
                           "--results", str(out), "--no-render"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    summary = [line for line in proc.stderr.splitlines() if " cases, " in line]
    assert summary and str(out) in summary[0]
    timing = [line for line in proc.stderr.splitlines() if line.startswith("time: ")]
    assert timing and timing[0].rstrip().endswith(" s") and "=" in timing[0]


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs /proc")
def test_a_results_folder_nothing_can_be_written_to_is_refused_before_the_first_estimate(tmp_path, capsys):
    from pathlib import Path

    sweep = Path(__file__).parent / "fixtures" / "sweeps" / "tiny.yaml"
    assert main(["sweep", str(sweep), "--results", "/proc/reportgen-results", "--no-render"]) == 2
    err = _err(capsys)
    assert "--results /proc/reportgen-results: cannot be written" in err and "Traceback" not in err
