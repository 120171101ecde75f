"""Ctrl-C in a long run: what is finished stays, nothing is half-written, the command says so and
exits 130, and a rerun goes on from there. A Ctrl-C is never recorded as one case's failure (the
trace loop and the measuring harness re-raise it instead of writing it down)."""

from __future__ import annotations

import json

import pytest

from reportgen import traced_results
from reportgen.cli import main

SWEEP = """\
name: tiny
grids:
  - model: [llama-3.2-1b, tinyllama-1.1b]
    gpu: [t4, rtx-4090]
    method: [lora, qlora]
    seq: 1024
"""


def _stop_after(n: int, real):
    calls = []

    def wrapped(*args, **kwargs):
        if len(calls) == n:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    return wrapped


def test_ctrl_c_during_the_estimates_keeps_the_finished_cases(tmp_path, monkeypatch, capsys):
    import reportgen.runner as runner

    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "results"
    argv = ["sweep", str(path), "--results", str(out), "--no-render"]
    monkeypatch.setattr(runner, "compute_result", _stop_after(3, runner.compute_result))
    assert main(argv) == 130
    assert "interrupted: finished cases are saved; rerun to continue" in capsys.readouterr().err
    files = sorted((out / "tiny").iterdir())
    assert len(files) == 3 and all(json.loads(p.read_text())["status"] == "ok" for p in files)  # no temp file
    monkeypatch.undo()
    assert main(argv) == 0
    assert "8 cases, 5 written, 3 unchanged" in capsys.readouterr().err


def test_ctrl_c_during_a_trace_sweep_is_no_failed_case(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    import reportgen.trace.result as result
    from tests.torch_saved import TINY

    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY["llama"]))
    sweep_file = tmp_path / "t.yaml"
    sweep_file.write_text(f"name: t\ngrids:\n  - model: {config}\n    gpu: rtx-4090\n    method: [full, lora]\n"
                          "    seq: 64\n")
    argv = ["sweep", str(sweep_file), "--results", str(tmp_path / "results"), "--trace", "--no-render"]
    monkeypatch.setattr(result, "trace_case", _stop_after(1, result.trace_case))
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "trace failed" not in err
    assert len(traced_results.traced_files(tmp_path / "results" / "t")) == 1
    monkeypatch.undo()
    assert main(argv) == 0
    assert "1 written, 1 current" in capsys.readouterr().err
    assert len(traced_results.traced_files(tmp_path / "results" / "t")) == 2
