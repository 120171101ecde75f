"""Issue 32, item 3: ``reportgen trace --lengths FILE`` traces the step once per padded length the drawn
batches take and replays a run of them through one caching allocator (``trace/multistep.py``), beside the
analytic answer of ``estimate --lengths`` (``estimate/lengths.reserved_growth``)."""

from __future__ import annotations

import json
import shutil

import pytest

from reportgen.cli import main
from reportgen.datalengths import Lengths
from reportgen.estimate.lengths import GROWTH_STEP, SHORTEST, draw_step_lengths
from reportgen.setup import TrainingSetup

GIB = 2**30


# ----- the draw and the buckets (no torch) --------------------------------------------------------
def test_the_draw_pads_each_batch_to_its_longest_sample_cut_at_seq():
    """Lengths 100 and 200, one sample each, batches of two: a batch is 100 long only when both draws are
    100 (1/4 of the batches); a cut at 150 makes the 200 a 150; a one-token sample is priced at SHORTEST."""
    lengths = Lengths((100, 200), (1, 1))
    steps = draw_step_lengths(lengths, TrainingSetup(seq=1000, batch=2), 4000, seed=3)
    assert {s for (s,) in steps} == {100, 200}
    assert sum(s == 100 for (s,) in steps) / 4000 == pytest.approx(1 / 4, abs=0.03)
    assert steps == draw_step_lengths(lengths, TrainingSetup(seq=1000, batch=2), 4000, seed=3)  # one run per seed
    assert steps != draw_step_lengths(lengths, TrainingSetup(seq=1000, batch=2), 4000, seed=4)
    assert {s for (s,) in draw_step_lengths(lengths, TrainingSetup(seq=150, batch=2), 50)} <= {100, 150}
    assert draw_step_lengths(Lengths((1,), (5,)), TrainingSetup(seq=64, batch=1, accum=3), 2) == [(SHORTEST,) * 3] * 2


def test_lengths_beyond_the_traced_limit_are_padded_up_to_a_multiple():
    pytest.importorskip("torch")
    from reportgen.trace.multistep import bucket_lengths

    assert bucket_lengths([100, 130, 300], 1000) == ([100, 130, 300], 1)  # few lengths: as drawn
    # at most 2 lengths: multiples of 256 (128 still gives 128, 256, 384); the cut stays a length of its own
    assert bucket_lengths([100, 130, 300], 1000, most=2) == ([256, 256, 512], 256)
    assert bucket_lengths([100, 130, 300], 300, most=2) == ([256, 256, 300], 256)


# ----- the replay (torch) -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def traces():
    """llama-3.2-1b LoRA, batch 2, the loop keeping each step's outputs to the next (a carry between steps)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from reportgen import catalog
    from reportgen.trace.multistep import trace_lengths

    setup = TrainingSetup(method="lora", batch=2, seq=512, keep_outputs="next-step")
    return trace_lengths(catalog.load_model("llama-3.2-1b"), setup, catalog.load_gpu("rtx-4090"), {128, 496, 512})


def test_steps_of_one_length_replay_exactly_the_single_trace(traces):
    """Splicing steps is exact: a run at one length reaches, from its second step on, the figures of the
    trace's own measured step (``trace/replay.replay``), kept outputs handed from step to step included."""
    from reportgen.trace.multistep import replay_steps
    from reportgen.trace.replay import replay

    t = traces[512]
    held_in, held_out = t.live(t.reset)[1], t.live(t.end)[1]  # the loop's kept outputs, handed between steps
    assert held_in and len(held_in) == len(held_out)
    for length in (128, 512):
        alone = replay(traces[length].run)
        r = replay_steps(traces, [length] * 4)
        assert r.reserved[1:] == [alone.peak_reserved] * 3
        assert r.allocated[1] == alone.peak_allocated


def test_a_slightly_longer_step_needs_new_segments_past_the_longest_alone(traces):
    """CUDACachingAllocator.cpp, Note [Expandable Segments]: a step slightly longer than the cached ones
    cannot reuse their blocks and nothing merges across segments, so 496 then 512 tokens reserves more
    than 512 alone (what the analytic answer prices), while 128 then 512 nearly does not."""
    from reportgen.trace.multistep import replay_steps

    alone = replay_steps(traces, [512, 512]).reserved[-1]
    close = replay_steps(traces, [496, 512]).peak_reserved
    far = replay_steps(traces, [128, 512]).peak_reserved
    assert far - alone < 0.05 * alone < close - alone


def test_a_skewed_dataset_grows_the_reserve_and_agrees_with_the_analytic_answer(tmp_path, capsys):
    """The done-when of issue 32: 98 % of samples at 64 tokens, 2 % at 512; the first batch of two is short,
    the run meets a long one within 500 steps, and the replayed reserve after 500 steps is within 5 % of
    ``estimate --lengths``'s (the longest step's reserve: one long length, so no slivers of near lengths)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    path = tmp_path / "lengths.txt"
    path.write_text("64 980\n512 20\n")
    flags = ["--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "lora", "--batch", "2", "--lengths", str(path)]
    assert main(["trace", *flags, "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "traced" and d["steps"] == GROWTH_STEP and d["traced_lengths"] == [64, 512]
    assert len(d["reserved_per_step"]) == GROWTH_STEP and d["peak_reserved"] == max(d["reserved_per_step"])
    assert d["first_step"] == {"longest": 64, "peak_reserved": d["reserved_per_step"][0]}
    assert d["peak_reserved"] > 1.5 * d["first_step"]["peak_reserved"]
    assert d["peak_reserved"] >= d["alone_at_longest"]
    assert d["worst_batch"]["longest"] == 512 and d["worst_batch"]["peak_allocated"] < d["peak_reserved"]
    assert main(["estimate", *flags, "--format", "json"]) == 0
    analytic = json.loads(capsys.readouterr().out)["lengths"]["reserved_growth"]
    assert d["analytic"] == analytic
    assert abs(d["difference"]) < 0.05
    assert d["difference"] == pytest.approx(d["peak_reserved"] / analytic[str(GROWTH_STEP)]["peak_reserved"] - 1)
    assert main(["trace", *flags, "--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert "traced replay vs analytic after 20 steps" in out and "first step" in out


# ----- gradient accumulation, packed batches, the trainer's step (torch) ----------------------------
def _traced(setup, lengths, recipe_setup=None):
    from reportgen import catalog
    from reportgen.trace.multistep import trace_lengths
    from reportgen.trace.runner import recipe_context

    with recipe_context(recipe_setup or setup):
        return trace_lengths(catalog.load_model("llama-3.2-1b"), setup, catalog.load_gpu("rtx-4090"), lengths)


def test_a_step_of_micro_batches_spliced_from_two_is_the_traced_step_of_four():
    """With no outputs kept, each length is traced with two micro-batches (``traced_accum``) and the second
    stands for the later ones: four micro-batches of 512 spliced so reserve exactly what the trace of the
    accum-4 step reserves, and allocate what it allocates less the two token batches the shorter trace does not
    make (2 x batch x 512 int64: the module docstring's kilobytes)."""
    pytest.importorskip("peft")
    from reportgen.trace.multistep import replay_steps, traced_accum
    from reportgen.trace.replay import replay

    setup = TrainingSetup(method="lora", batch=2, seq=512, accum=4)
    assert traced_accum(setup) == 2 and traced_accum(setup.model_copy(update={"keep_outputs": "step"})) == 4
    spliced = replay_steps(_traced(setup, {512}), [(512,) * 4] * 3)
    alone = replay(_traced_at_accum(setup, 512))
    assert spliced.reserved[1:] == [alone.peak_reserved] * 2
    assert alone.peak_allocated - spliced.allocated[1] == 2 * 2 * 512 * 8


def _traced_at_accum(setup, length):
    """The step of ``setup.accum`` micro-batches traced as a whole (``trace/step.run_trace``)."""
    from reportgen import catalog
    from reportgen.estimate import constants as K
    from reportgen.estimate.memory import cublas_workspace_bytes
    from reportgen.trace.step import run_trace

    gpu = catalog.load_gpu("rtx-4090")
    return run_trace(catalog.load_model("llama-3.2-1b"), setup.model_copy(update={"seq": length}),
                     cublas_workspace_bytes(gpu) // K.CUBLAS_HANDLES, K.CUBLAS_HANDLES)


def test_kept_outputs_are_handed_from_micro_batch_to_micro_batch_of_other_lengths():
    """``next-step``: each micro-batch holds the one before's outputs until its forward returns, so every
    micro-batch is traced (three); steps of one length replay the traced step exactly, and steps whose
    micro-batches mix lengths splice (each micro-batch's held tensors paired with the run's) and reserve what
    their longest micro-batch needs."""
    pytest.importorskip("peft")
    from reportgen.trace.multistep import replay_steps
    from reportgen.trace.replay import replay

    setup = TrainingSetup(method="lora", batch=2, seq=512, accum=3, keep_outputs="next-step")
    traces = _traced(setup, {128, 512})
    assert traces[512].micro_batches == 3
    for length in (128, 512):
        alone = replay(traces[length].run)
        r = replay_steps(traces, [(length,) * 3] * 3)
        assert r.reserved[1:] == [alone.peak_reserved] * 2 and r.allocated[1] == alone.peak_allocated
    mixed = replay_steps(traces, [(128,) * 3, (128, 512, 128), (512, 128, 128)])
    assert mixed.lengths == [128, 512, 512]
    assert mixed.reserved[0] < replay(traces[512].run).peak_reserved <= mixed.peak_reserved


def test_the_trainers_step_replays_as_the_loops(tmp_path, capsys):
    """trl-sft: the trainer's step is ``train_step`` with its ``compute_loss`` (``trace/sft.recipe_trace``), so
    the same marks cut it: steps of one length replay its traced step exactly, and the CLI answers with the
    recipe's own hash."""
    pytest.importorskip("peft")
    pytest.importorskip("trl")
    from reportgen.fingerprint import steps_trace_hash
    from reportgen.trace.multistep import replay_steps
    from reportgen.trace.replay import replay

    setup = TrainingSetup(method="lora", batch=2, seq=256, accum=2, recipe="trl-sft")
    traces = _traced(setup, {256})
    alone = replay(traces[256].run)
    r = replay_steps(traces, [(256, 256)] * 3)
    assert r.reserved[1:] == [alone.peak_reserved] * 2 and r.allocated[1] == alone.peak_allocated
    path = tmp_path / "lengths.txt"
    path.write_text("64 9\n256 1\n")
    assert main(["trace", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "lora", "--recipe", "trl-sft",
                 "--batch", "2", "--accum", "2", "--lengths", str(path), "--steps", "10", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["alone_at_longest"] == alone.peak_reserved  # the trainer's step, not the loop's
    assert d["trace_hash"] == steps_trace_hash(recipe="trl-sft") != steps_trace_hash()
    assert d["peak_reserved"] >= d["first_step"]["peak_reserved"] and d["analytic"]["10"]["peak_reserved"] > 0


def test_gradient_accumulation_on_a_skewed_dataset_agrees_with_the_analytic_answer(tmp_path, capsys):
    """Issue 32, accum 4: each micro-batch is drawn and padded on its own (batch x accum x steps samples, as
    ``estimate/lengths.reserved_growth`` prices them); 98 % of samples at 64 tokens, 2 % at 512: the replayed
    reserve after 100 steps is within 5 % of the analytic one and no less than the first step's, and both
    answers' first step follows its longest micro-batch."""
    pytest.importorskip("peft")
    path = tmp_path / "lengths.txt"
    path.write_text("64 980\n512 20\n")
    flags = ["--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "lora", "--batch", "2", "--accum", "4",
             "--lengths", str(path), "--steps", "100"]
    assert main(["trace", *flags, "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["accum"] == 4 and d["traced_micro_batches"] == 2 and d["traced_lengths"] == [64, 512]
    assert len(d["micro_batch_lengths"]) == 100 and {len(s) for s in d["micro_batch_lengths"]} == {4}
    assert d["step_lengths"] == [max(s) for s in d["micro_batch_lengths"]]
    assert any(len(set(s)) > 1 for s in d["micro_batch_lengths"])  # steps whose micro-batches differ
    assert d["first_step"]["longest"] == max(d["micro_batch_lengths"][0])
    assert d["peak_reserved"] >= d["first_step"]["peak_reserved"]
    assert d["peak_reserved"] >= d["alone_at_longest"]
    assert d["analytic"]["100"]["longest"] == 512 and abs(d["difference"]) < 0.05
    assert main(["trace", *flags]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "100 steps of 4 micro-batches of 2" in out and "the first step's reserve follows the longest of its micro-batches" in out


def test_packed_batches_are_one_length_answered_not_refused(tmp_path, capsys):
    """``--padding packed``: every micro-batch is ``seq`` tokens, so the run is one length: traced once, the
    reserve the step's own from the second step on, the analytic answer the step's estimate, and said so."""
    pytest.importorskip("peft")
    from reportgen import catalog
    from reportgen.estimate.memory import estimate_memory

    path = tmp_path / "lengths.txt"
    path.write_text("64 980\n256 20\n")
    assert main(["trace", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "lora", "--padding", "packed",
                 "--accum", "2", "--lengths", str(path), "--steps", "5", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["traced_lengths"] == [256] and d["micro_batch_lengths"] == [[256, 256]] * 5
    assert d["reserved_per_step"][1:] == [d["alone_at_longest"]] * 4
    setup = TrainingSetup.model_validate(d["setup"])
    expected = estimate_memory(catalog.load_model("llama-3.2-1b"), setup, catalog.load_gpu("rtx-4090"))
    assert d["analytic"]["5"] == {"longest": 256, "peak_reserved": expected.peak_reserved}
    assert "every micro-batch is 256 tokens" in d["notes"][0]


# ----- what a user can get wrong ------------------------------------------------------------------
@pytest.mark.parametrize("text, extra, message", [
    (None, [], "cannot read the lengths file"),
    ("300\n-5\n", [], ":2: tokens -5 is out of range"),
    ("300\nlots\n", [], ":2: 'lots' is not a number"),
    ("300\n1e9\n", [], "out of range (1 to 16,777,216)"),
    ("300\n", ["--steps", "0"], "expected a whole number of 1 or more"),
    ("300\n", ["--steps", "1e6"], "more than the 10,000 the replay runs"),
    ("300\n", ["--recipe", "grpo", "--method", "lora", "--batch", "8", "--seq", "1024"], "recipe grpo: a GRPO step's lengths"),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, text, extra, message):
    path = tmp_path / "lengths.txt"
    if text is not None:
        path.write_text(text)
    try:
        code = main(["trace", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--lengths", str(path), *extra])
    except SystemExit as exc:  # argparse rejects a type itself, with status 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_steps_without_lengths_is_an_error(capsys):
    assert main(["trace", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--steps", "10"]) == 2
    assert "--lengths FILE" in capsys.readouterr().err


# ----- its own hash -----------------------------------------------------------------------------
def test_editing_the_replay_leaves_every_stored_trace_current(tmp_path):
    """``trace/multistep.py`` computes no stored figure: an edit changes its own hash, not the loop's (an
    edit of the tracer proper changes both)."""
    from reportgen.fingerprint import PACKAGE, loop_trace_hash, steps_trace_hash, trace_hash

    assert loop_trace_hash() == trace_hash("loop")
    pkg = tmp_path / "reportgen"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    loop, steps = loop_trace_hash(pkg), steps_trace_hash(pkg)
    with open(pkg / "trace" / "multistep.py", "a") as f:
        f.write("\n# edited by a test\n")
    assert loop_trace_hash(pkg) == loop and steps_trace_hash(pkg) != steps
    sft = steps_trace_hash(pkg, recipe="trl-sft")
    with open(pkg / "trace" / "sft.py", "a") as f:  # the trainer's step: its replays only
        f.write("\n# edited by a test\n")
    assert steps_trace_hash(pkg, recipe="trl-sft") != sft and loop_trace_hash(pkg) == loop
    with open(pkg / "trace" / "replay.py", "a") as f:
        f.write("\n# edited by a test\n")
    assert loop_trace_hash(pkg) != loop


def test_a_family_without_analytic_formulas_gets_the_replay_alone(tmp_path, capsys):
    """GPT-NeoX has no formulas: llama's would price it silently; the replay answers alone and says why."""
    pytest.importorskip("torch")
    from pathlib import Path

    path = tmp_path / "lengths.txt"
    path.write_text("32 9\n128 1\n")
    config = Path(__file__).parent / "fixtures" / "configs" / "gpt-neox-scaled.json"
    assert main(["trace", "--model", str(config), "--gpu", "rtx-4090", "--method", "lora", "--lengths", str(path),
                 "--steps", "20", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["analytic"] == {"error": "model_type 'gpt_neox' has no analytic formulas"} and d["difference"] is None
    assert d["peak_reserved"] >= d["first_step"]["peak_reserved"] > 0
