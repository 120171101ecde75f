"""Sweep files: grid expansion, exclusion, overrides, clear errors, stable ids, resumable results."""

import json
import time
from pathlib import Path

import pytest

from reportgen.cli import main
from reportgen.errors import UserError
from reportgen.runner import run_estimates
from reportgen.sweep import load_sweep

GOOD = """\
name: tiny
grids:
  - model: [llama-3.2-1b, tinyllama-1.1b]
    gpu: [t4, rtx-4090]
    method: [lora, qlora]
    seq: 1024
exclude:
  - {model: tinyllama-1.1b, method: qlora}
override:
  - when: {gpu: t4}
    set: {precision: fp16-mixed}
"""


def write(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_expands_excludes_and_overrides(tmp_path):
    sweep = load_sweep(write(tmp_path, GOOD))
    assert len(sweep.cases) == 2 * 2 * 2 - 2
    t4 = [c for c in sweep.cases if c.gpu == "t4"]
    assert {c.setup.precision.value for c in t4} == {"fp16-mixed"}
    assert all(not (c.model == "tinyllama-1.1b" and c.setup.method.value == "qlora") for c in sweep.cases)


def test_case_ids_are_stable(tmp_path):
    a = [c.id for c in load_sweep(write(tmp_path, GOOD)).cases]
    b = [c.id for c in load_sweep(write(tmp_path, GOOD, "t.yaml")).cases]
    assert a == b and len(set(a)) == len(a)
    assert a[0].startswith("llama-3.2-1b.") or a[0].startswith("tinyllama")


@pytest.mark.parametrize("text,line,needle", [
    (GOOD.replace("    seq: 1024", "    seqlen: 1024"), 6, "unknown key 'seqlen'"),
    (GOOD.replace("method: [lora, qlora]", "method: [lora, dora]"), 1, "method"),
    (GOOD.replace("gpu: [t4, rtx-4090]", "gpu: [t4, rtx4090]"), 4, "rtx-4090"),
    (GOOD + "bogus: 1\n", 12, "bogus"),
    ("name: x\ngrids: [\n", 3, "not valid YAML"),
])
def test_bad_files_name_file_line_and_fix(tmp_path, text, line, needle):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as exc:
        load_sweep(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:")
    assert needle in msg
    if line > 1:
        assert f"{path}:{line}:" in msg


def test_bad_enum_lists_allowed_values(tmp_path):
    path = write(tmp_path, GOOD.replace("method: [lora, qlora]", "method: [lora, dora]"))
    with pytest.raises(UserError) as exc:
        load_sweep(path)
    assert "full, lora, qlora" in str(exc.value)
    assert f"{path}:5:" in str(exc.value)


def test_bad_sweep_exits_2_and_writes_nothing(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("    seq: 1024", "    seqlen: 1024"))
    results = tmp_path / "results"
    assert main(["sweep", str(path), "--results", str(results), "--no-render"]) == 2
    assert not results.exists()


def test_results_written_skipped_and_forced(tmp_path):
    sweep = load_sweep(write(tmp_path, GOOD))
    out = tmp_path / "results"
    first = run_estimates(sweep, out)
    assert first.written == len(sweep.cases) and first.failed == 0
    files = sorted((out / "tiny").glob("*.json"))
    assert len(files) == len(sweep.cases)
    data = json.loads(files[0].read_text())
    assert data["schema_version"] == 2 and data["status"] == "ok"
    assert {"case", "estimate", "status", "inputs_hash", "estimator_hash"} <= set(data)
    assert "measurement" not in data  # measurements live in their own files (reportgen/store.py)
    mtime = files[0].stat().st_mtime_ns
    time.sleep(0.01)
    again = run_estimates(sweep, out)
    assert again.written == 0 and again.skipped == len(sweep.cases)
    assert files[0].stat().st_mtime_ns == mtime
    assert run_estimates(sweep, out, force=True).written == len(sweep.cases)


def test_shipped_sweeps_load():
    consumer = load_sweep("sweeps/consumer.yaml")
    assert {c.gpu for c in consumer.cases} == {"t4", "rtx-3060", "rtx-3090", "rtx-4090"}
    assert {c.setup.method.value for c in consumer.cases} == {"full", "lora", "qlora"}
    assert min(c.setup.seq for c in consumer.cases) == 512 and max(c.setup.seq for c in consumer.cases) == 8192
    datacenter = load_sweep("sweeps/datacenter.yaml")
    assert {"a10g", "l4", "a100-40gb", "a100-80gb", "h100-pcie", "h100-sxm", "h200"} == {c.gpu for c in datacenter.cases}


def test_a_new_setup_field_at_its_old_value_keeps_case_ids():
    """Result files are found by case id: adding lora_dropout must not orphan any of them, while a
    setup that uses it gets its own id."""
    from reportgen.results import case_id
    from reportgen.setup import TrainingSetup

    setup = TrainingSetup(method="lora").model_dump(mode="json")
    before = {k: v for k, v in setup.items() if k != "lora_dropout"}  # a setup as written before the field
    assert case_id("llama-3.2-1b", "t4", setup) == case_id("llama-3.2-1b", "t4", before)
    dropped = TrainingSetup(method="lora", lora_dropout=0.1).model_dump(mode="json")
    assert case_id("llama-3.2-1b", "t4", dropped) != case_id("llama-3.2-1b", "t4", setup)


# ----- issue 20: every bad sweep is a message at its line, never a traceback or a silent guess ----
HARDEN = [
    # a misspelled key in an override's set: (was a TypeError traceback)
    ("set-typo", GOOD.replace("set: {precision: fp16-mixed}", "set: {precison: fp16-mixed}"), 11,
     ["override[0].set: unknown key 'precison'", "did you mean 'precision'"]),
    # an override's bad value is reported at the override's line (was the grid's)
    ("set-value", GOOD.replace("set: {precision: fp16-mixed}", "set: {precision: fp17}"), 11,
     ["override[0].set.precision", "fp16-mixed"]),
    ("set-gpu", GOOD.replace("set: {precision: fp16-mixed}", "set: {gpu: nosuch}"), 11,
     ["override[0].set.gpu: unknown GPU 'nosuch'"]),
    ("set-cross-field", GOOD.replace("set: {precision: fp16-mixed}", "set: {gpus: 2}"), 11,
     ["override[0].set.sharding", "gpus=2 needs sharding"]),
    # a misspelled top-level key is named as such (was "grids: Field required")
    ("grid-typo", GOOD.replace("grids:", "grid:"), 2, ["unknown key 'grid'", "did you mean 'grids'"]),
    ("duplicate-key", GOOD.replace("    seq: 1024", "    seq: 1024\n    seq: 2048"), 7,
     ["duplicate key 'seq' (first at line 6)", "a list gives several values: key: [a, b]"]),
    ("exclude-choice", GOOD.replace("{model: tinyllama-1.1b, method: qlora}", "{method: ful}"), 8,
     ["exclude[0].method", "full, lora, qlora"]),
    ("when-gpu", GOOD.replace("when: {gpu: t4}", "when: {gpu: rtx4090}"), 10,
     ["override[0].when.gpu: unknown GPU 'rtx4090'", "rtx-4090"]),
    ("exclude-model", GOOD.replace("{model: tinyllama-1.1b, method: qlora}", "{model: tinyllama}"), 8,
     ["exclude[0].model: 'tinyllama' names no model", "tinyllama-1.1b"]),
    ("set-list", GOOD.replace("set: {precision: fp16-mixed}", "set: {precision: [fp16-mixed, fp32]}"), 11,
     ["sets one value, not a list"]),
    ("empty-list", GOOD.replace("method: [lora, qlora]", "method: []"), 5, ["an empty list expands to no case"]),
    ("recursive", "name: x\ngrids: &g\n  - {model: llama-3.2-1b, gpu: t4, seq: *g}\n", 2, ["recursive value"]),
    ("alias-bomb", "name: x\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'a'] * 9)}]\n" for i in range(7))
     + "grids: [{model: llama-3.2-1b, gpu: t4, seq: *l6}]\n", 0, ["values once its aliases are expanded"]),
    ("deep", "name: x\ngrids: " + "[" * 200 + "]" * 200 + "\n", 0, ["nested"]),
    ("huge-int", "name: x\ngrids: [{model: llama-3.2-1b, gpu: t4, seq: 1" + "0" * 5000 + "}]\n", 0,
     ["a value cannot be read"]),
    # a LoRA key in a grid of full fine-tuning only changes nothing (was: one case per value, same run)
    ("lora-key-full", GOOD.replace("method: [lora, qlora]", "method: [full]\n    lora_rank: [8, 16]"), 6,
     ["grids[0].lora_rank: applies only to method lora or method qlora", "add the method to the grid"]),
    # a top-level value says what that key takes (the hint listed the top-level keys)
    ("tokens-word", GOOD + "train_tokens: lots\n", 12, ["train_tokens:", "(got 'lots')", "from 1 to 1e15"]),
    ("tokens-huge", GOOD + "train_tokens: 1e30\n", 12, ["train_tokens:", "from 1 to 1e15"]),
    ("name-spaces", GOOD.replace("name: tiny", "name: My Sweep"), 1, ["(got 'My Sweep')", "lower-case letters"]),
    # a cross-field rule's hint was the field's allowed values, the refused one among them
    ("cross-field-hint", GOOD.replace("    seq: 1024", "    seq: 1024\n    gpus: [1, 2]\n    sharding: [ddp]"), 8,
     ["sharding 'ddp' needs gpus > 1", "hint: a rule across fields: leave that cell out"]),
    # a number's hint was "expected int", though 0 is an int
    ("batch-zero-hint", GOOD.replace("    seq: 1024", "    seq: 1024\n    batch: [0, 1]"), 7,
     ["must be >= 1 (got 0)", "hint: batch: a whole number from 1 to 4096"]),
]


def test_train_tokens_written_as_the_cli_writes_them(tmp_path):
    """``train_tokens: 1e8`` is a string to YAML 1.1; ``--train-tokens 1e8`` is the CLI's form of it."""
    assert load_sweep(write(tmp_path, GOOD + "train_tokens: 1e8\n")).spec.train_tokens == 10**8
    assert load_sweep(write(tmp_path, GOOD + "train_tokens: 2_000_000\n")).spec.train_tokens == 2 * 10**6


def test_a_grid_across_methods_keeps_one_case_per_run(tmp_path):
    """``method: [full, lora]`` with ``lora_rank: [8, 16]``: two LoRA cases and one full case (a full
    case per rank would be the same run under two ids, measured and shown twice)."""
    text = "name: x\ngrids:\n  - {model: llama-3.2-1b, gpu: t4, method: [full, lora], lora_rank: [8, 16]}\n"
    cases = load_sweep(write(tmp_path, text)).cases
    assert sorted((c.setup.method.value, c.setup.lora_rank) for c in cases) == [("full", 16), ("lora", 8),
                                                                               ("lora", 16)]


@pytest.mark.parametrize("name, text, line, needles", HARDEN, ids=[h[0] for h in HARDEN])
def test_bad_sweeps_are_messages_at_their_line(tmp_path, capsys, name, text, line, needles):
    path = write(tmp_path, text)
    results = tmp_path / "results"
    assert main(["sweep", str(path), "--results", str(results), "--docs", str(tmp_path / "docs")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and f"{path}:" in err
    if line:
        assert f"{path}:{line}:" in err, err
    for needle in needles:
        assert needle in err, err
    assert not results.exists() and not (tmp_path / "docs").exists()


def test_a_sweep_file_that_is_not_utf8_is_a_message(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(GOOD.encode() + b"description: caf\xe9\n")
    assert main(["sweep", str(path), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:12: not UTF-8" in " ".join(err.split()) and "Traceback" not in err


def test_a_grid_above_the_limit_needs_max_cases(tmp_path, capsys):
    """The audit's 100,000-case grid ran for minutes and wrote 402 MB without a word."""
    text = GOOD.replace("    seq: 1024", "    seq: [" + ", ".join(str(512 + i) for i in range(3000)) + "]")
    path = write(tmp_path, text)
    assert main(["sweep", str(path), "--results", str(tmp_path / "r"), "--no-render"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "expand to 24,000 cells" in err and "--max-cases 24000" in err and not (tmp_path / "r").exists()
    assert len(load_sweep(path, max_cases=24_000).cases) == 24_000 - 6_000  # the exclude rule drops some


def test_a_rule_that_matches_nothing_is_a_warning(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("when: {gpu: t4}", "when: {gpu: h100-sxm}"))
    assert main(["sweep", str(path), "--results", str(tmp_path / "r"), "--no-render"]) == 0
    assert f"{path}:10: override[0] matches no cell of the grids" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("flags, needle", [
    (["--shard", "abc"], "expected I/N"), (["--shard", "5/2"], "0 <= I < N"), (["--shard", "0/0"], "N >= 1"),
    (["--docs", "FILE"], "--docs"), (["--results", "FILE"], "--results"),
])
def test_bad_sweep_flags_are_refused_before_anything_is_written(tmp_path, capsys, flags, needle):
    path = write(tmp_path, GOOD.replace("name: tiny", "name: tiny\nmeasure: {enabled: true}"))
    (tmp_path / "FILE").write_text("x")
    flags = [str(tmp_path / "FILE") if f == "FILE" else f for f in flags]
    argv = ["sweep", str(path), "--results", str(tmp_path / "r"), "--docs", str(tmp_path / "d")] + flags
    assert main(argv) == 2
    assert needle in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


def test_your_card_sweep_is_one_edit_away_from_any_card_and_feeds_the_gemm_fit(tmp_path):
    """sweeps/your-card.yaml: the card and the precision are written once (the other cases repeat them), every
    case fits a 24 GiB card and three fit a 10 GB one, and all are GPU-bound (``scripts/calibrate.py``
    COMPUTE_SHARE_MIN), so a user's measurements of them fit their generation's GEMM efficiency."""
    from reportgen import catalog
    from reportgen.estimate import estimate

    text = Path("sweeps/your-card.yaml").read_text()
    assert text.count("gpu: &card rtx-4090") == 1 and "gpu: rtx-4090" not in text
    edited = tmp_path / "your-card.yaml"
    turing = text.replace("gpu: &card rtx-4090", "gpu: &card rtx-2080-ti").replace(
        "precision: &precision bf16-mixed", "precision: &precision fp16-mixed")
    edited.write_text(turing)
    cases = load_sweep(edited).cases
    assert {c.gpu for c in cases} == {"rtx-2080-ti"}
    assert {c.setup.precision.value for c in cases} == {"fp16-mixed", "bf16"}  # the full bf16 case stays (an oom there)
    cases = load_sweep("sweeps/your-card.yaml").cases
    assert {c.gpu for c in cases} == {"rtx-4090"} and len(cases) == 9
    small = 0
    for c in cases:
        e = estimate(catalog.load_model(c.model), catalog.load_gpu(c.gpu), c.setup, reverse=False)
        assert e.fits, c.id
        p = e.time.parts
        assert p["transfer"] + p["host_exposed"] <= 0.1 * e.time.step_s, c.id
        small += estimate(catalog.load_model(c.model), catalog.load_gpu("rtx-3080"), c.setup, reverse=False).fits
    assert small == 3
