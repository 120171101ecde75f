"""The timed steps' logic without a GPU: the median's confidence interval, the spread, the stopping
rule, the old settings' meaning, the resume rule and the case planning that depend on it, the
sweep's and the CLI's checks of the settings, and the words the terminal prints."""

import math

import pytest

from reportgen.cli import main
from reportgen.errors import UserError
from reportgen.measure import timing
from reportgen.measure.runner import _same_settings, expected_s
from reportgen.measure.timing import StopRule, median_ci, median_ci_ranks, rel_ci, rule_from_settings, stop_reason


# ----- the median's interval and the spread ----------------------------------------------------------
@pytest.mark.parametrize("n,ranks", [(5, None), (6, (1, 6)), (8, (1, 8)), (9, (2, 8)), (10, (2, 9)), (20, (6, 15)),
                                     (50, (18, 33))])
def test_median_interval_ranks_match_the_binomial_table(n, ranks):
    """Conover's order-statistic interval, the ranks of the usual tables (n=10: 2nd and 9th; n=20:
    6th and 15th; n=50: 18th and 33rd): each covers 95 %, one rank narrower does not; below 6 values
    no interval reaches 95 %."""
    assert median_ci_ranks(n) == ranks
    if ranks:
        j = ranks[0]
        coverage = 1 - 2 * sum(math.comb(n, k) for k in range(j)) / 2**n
        assert coverage >= 0.95
        wider = 1 - 2 * sum(math.comb(n, k) for k in range(j + 1)) / 2**n  # one rank narrower falls short
        assert wider < 0.95


def test_median_interval_and_relative_half_width():
    times = [1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.8, 1.0, 1.02, 0.98]  # n=10 -> (x(2), x(9)) = (0.9, 1.1)
    assert median_ci(times) == (0.9, 1.1)
    assert rel_ci(times) == pytest.approx(0.1 / 1.0)  # median 1.0, both ends 0.1 away
    assert rel_ci([0.1] * 5) is None  # too few for a 95 % interval


def test_summary_figures():
    times = [0.30, 0.10, 0.20, 0.40, 0.50, 0.60, 0.70]
    s = timing.summary(times)
    assert s["step_s"] == 0.40 and (s["step_s_min"], s["step_s_max"]) == (0.10, 0.70)
    # linear interpolation (numpy/torch default): q1 at position 1.5 of 0..6 -> 0.25, q3 -> 0.55
    assert (s["step_s_q1"], s["step_s_q3"]) == pytest.approx((0.25, 0.55))
    assert s["step_s_iqr_rel"] == pytest.approx(0.30 / 0.40)
    assert s["step_s_ci"] == [0.10, 0.70] and s["step_s_ci_rel"] == pytest.approx(0.30 / 0.40)
    assert s["steps_run"] == 7
    one = timing.summary([0.5])
    assert one["step_s"] == 0.5 and one["step_s_iqr_rel"] == 0 and one["step_s_ci"] is None


# ----- the stopping rule ---------------------------------------------------------------------------
ADAPTIVE = StopRule(min_steps=5, max_steps=50, max_timed_s=4.0, target_rel_ci=0.02)


def test_steady_steps_stop_as_stable_once_an_interval_exists():
    steady = [0.100, 0.101, 0.099, 0.100, 0.1005]
    assert stop_reason(steady, ADAPTIVE) is None  # 5 steps: no 95 % interval yet
    assert stop_reason(steady + [0.1], ADAPTIVE) == "stable"


def test_noisy_steps_run_until_the_time_cap_and_not_past_it():
    noisy = [0.1, 0.3, 0.2, 0.15, 0.25]
    times, reason = list(noisy), None
    while reason is None:
        times.append(noisy[len(times) % 5])
        reason = stop_reason(times, ADAPTIVE)
    assert reason == "time_cap"
    assert sum(times) <= 4.0 < sum(times) + 0.2  # the next step at the median would cross the cap


def test_max_steps_and_minimum():
    rule = StopRule(min_steps=3, max_steps=4, target_rel_ci=0.0001)
    noisy = [0.1, 0.3, 0.2, 0.15]
    assert [stop_reason(noisy[:n], rule) for n in (1, 2, 3, 4)] == [None, None, None, "max_steps"]
    # the minimum runs even past the cap
    slow = StopRule(min_steps=5, max_steps=50, max_timed_s=1.0)
    assert [stop_reason([4.9] * n, slow) for n in (1, 4, 5)] == [None, None, "time_cap"]


def test_old_settings_mean_a_fixed_count():
    """Files measured before the rule have only ``steps``: exactly that many, whatever else."""
    old = rule_from_settings({"device": "cuda", "warmup": 2, "steps": 5, "timeout_s": 300, "cap_to_gpu": True})
    assert old == StopRule(5, 5) and old.fixed
    assert [stop_reason([0.1, 0.5, 0.9, 0.2][:n] + [0.3] * max(0, n - 4), old) for n in (4, 5)] == [None, "max_steps"]
    assert old.key() == rule_from_settings({"steps": 5, "max_steps": 5, "max_timed_s": 4.0}).key()
    with pytest.raises(ValueError):
        StopRule(min_steps=5, max_steps=4)


def test_planned_time_bounds_the_timed_steps():
    assert timing.planned_timed_s(0.1, ADAPTIVE) == 4.0  # the cap
    assert timing.planned_timed_s(4.9, ADAPTIVE) == pytest.approx(5 * 4.9)  # the minimum, past the cap
    assert timing.planned_timed_s(0.01, ADAPTIVE) == pytest.approx(0.5)  # max_steps first
    assert timing.planned_timed_s(0.2, StopRule(5, 5)) == pytest.approx(1.0)


# ----- settings, resume and planning --------------------------------------------------------------
OLD = {"device": "cuda", "warmup": 2, "steps": 5, "timeout_s": 300, "cap_to_gpu": True}
NEW = {"device": "cuda", "warmup": 3, "steps": 5, "max_steps": 50, "max_timed_s": 4.0, "target_rel_ci": 0.02,
       "timeout_s": 300, "cap_to_gpu": True, "profile": True, "profile_steps": 2}


def test_resume_rule_knows_the_old_files_and_the_new_settings():
    assert _same_settings(OLD, dict(OLD))
    assert _same_settings(OLD, dict(OLD, max_steps=5, max_timed_s=9.0))  # a fixed 5 is a fixed 5
    assert not _same_settings(OLD, dict(OLD, max_steps=50, max_timed_s=4.0, target_rel_ci=0.02))
    assert not _same_settings(OLD, NEW)
    assert _same_settings(NEW, dict(NEW))
    assert not _same_settings(NEW, dict(NEW, target_rel_ci=0.05))
    assert not _same_settings(dict(NEW, profile=False), NEW)  # a profile asked for is measured
    assert _same_settings(NEW, dict(NEW, profile=False))  # a profiled attempt also settles an unprofiled ask
    assert not _same_settings(dict(NEW, profile_steps=1), NEW)


def test_expected_time_plans_the_adaptive_steps_and_the_profile():
    from reportgen.measure.profiling import PROFILE_WARMUP
    from reportgen.measure.runner import (CASE_OVERHEAD_S, PROFILE_OVERHEAD_S, PROFILE_SLOWDOWN,
                                          STEP_TIME_MARGIN)

    est = {"estimate": {"time": {"step_s": 0.1}}}
    step = STEP_TIME_MARGIN * 0.1
    plain = dict(NEW, profile=False)
    assert expected_s(est, plain) == pytest.approx(CASE_OVERHEAD_S + 3 * step + 4.0)
    assert expected_s(est, NEW) == pytest.approx(expected_s(est, plain) + PROFILE_OVERHEAD_S
                                                 + PROFILE_SLOWDOWN * step * (PROFILE_WARMUP + 2))
    assert expected_s(est, OLD) == pytest.approx(CASE_OVERHEAD_S + 7 * step)  # the old fixed plan


#: seconds scripts/validate_on_gpu.sh spent before the sweep in the H100 run (wheels, import check):
#: 28, 20 and 28 s of its three calls (results/validation/logs/h100-2026-11-25)
SCRIPT_SETUP_S = 30


def test_validation_sweep_fits_three_calls_at_the_measured_per_case_cost():
    """The published H100 run (results/validation/logs/h100-2026-11-25): three shards of 17-18
    cases. With the sweep's settings, a shard's worst case (every case runs to its cap) is each
    case's measured wall time plus its extra warm-up steps, its extra timed steps up to the cap, and
    its profiled steps at the planning guesses; it must fit the script's default budget."""
    import json
    import re
    from pathlib import Path

    from reportgen.measure.profiling import PROFILE_WARMUP
    from reportgen.measure.runner import PROFILE_OVERHEAD_S, PROFILE_SLOWDOWN, settings_for
    from reportgen.results import current_id
    from reportgen.sweep import load_sweep

    root = Path(__file__).resolve().parents[1]
    sweep = load_sweep(root / "sweeps" / "validation.yaml")
    settings = settings_for(sweep, "cuda")
    rule = rule_from_settings(settings)
    index = {c.id: i for i, c in enumerate(sweep.cases)}
    latest: dict[str, dict] = {}  # a case measured again counts its latest run
    for path in sorted((root / "results" / "validation" / "measured").glob("*.json")):
        doc = json.loads(path.read_text())
        if current_id(doc) not in latest or doc["measured_at"] > latest[current_id(doc)]["measured_at"]:
            latest[current_id(doc)] = doc
    shards = [0.0, 0.0, 0.0]
    for cid, doc in latest.items():
        m, old = doc["measurement"], doc["settings"]
        step = m.get("step_s") or 0.0
        extra = 0.0  # a run with today's settings (timed to the stopping rule, profiled) cost its wall time
        if old.get("max_steps") is None:  # the fixed 5-step plan of 2026-11-25: what today's would add
            extra = (settings["warmup"] - old["warmup"]) * step + timing.planned_timed_s(step, rule) - old["steps"] * step
            if settings["profile"] and step:
                extra += PROFILE_OVERHEAD_S + PROFILE_SLOWDOWN * step * (PROFILE_WARMUP + settings["profile_steps"])
        shards[index[cid] % 3] += doc["wall_s"] + extra
    budget = int(re.search(r"BUDGET_S=\$\{2:-(\d+)\}", (root / "scripts" / "validate_on_gpu.sh").read_text()).group(1))
    assert max(shards) < budget - SCRIPT_SETUP_S, shards


def test_sweep_measure_settings_are_checked(tmp_path):
    from reportgen.sweep import load_sweep

    base = "name: t\ngrids:\n  - model: llama-3.2-1b\n    gpu: h100-sxm\nmeasure:\n"
    path = tmp_path / "s.yaml"
    path.write_text(base + "  steps: 5\n  max_steps: 3\n")
    with pytest.raises(UserError) as err:
        load_sweep(path)
    assert "s.yaml:5" in err.value.message and "max_steps (3) is below steps (5)" in err.value.message
    assert "measure keys" in (err.value.hint or "")
    path.write_text(base + "  target_rel_ci: 1.5\n")
    with pytest.raises(UserError, match="target_rel_ci"):
        load_sweep(path)
    path.write_text(base + "  steps: 80\n")  # max_steps follows a large minimum
    assert load_sweep(path).spec.measure.max_steps_or_default == 80


@pytest.mark.parametrize("args,needle", [
    (["--steps", "5", "--max-steps", "3"], "--max-steps 3"),
    (["--max-timed-s", "0"], "--max-timed-s"),
    (["--target-rel-ci", "1.5"], "--target-rel-ci"),
    (["--profile-steps", "2"], "--profile-steps: only with --profile"),
    (["--profile", "--profile-steps", "0"], "--profile-steps"),
])
def test_bad_timing_flags_exit_2(capsys, tmp_path, args, needle):
    from tests.measure_helpers import tiny_config

    tiny = str(tiny_config(tmp_path))
    assert main(["measure", "--model", tiny, "--gpu", "t4", "--device", "cpu", *args]) == 2
    assert needle in capsys.readouterr().err


def test_profile_dir_that_is_a_file_exits_2(capsys, tmp_path):
    from tests.measure_helpers import tiny_config

    tiny = str(tiny_config(tmp_path))
    (tmp_path / "afile").write_text("")
    assert main(["measure", "--model", tiny, "--gpu", "t4", "--device", "cpu", "--profile", str(tmp_path / "afile")]) == 2
    assert "not a directory" in capsys.readouterr().err


# ----- what is printed -----------------------------------------------------------------------------
def test_timing_note_for_new_and_old_measurements():
    new = dict(timing.summary([0.1] * 6), step_times_s=[0.1] * 6, stop_reason="stable")
    assert timing.timing_note(new) == "6 timed steps, stopped: stable; median +-0.0% (95% CI); IQR 0.0% of the median"
    old = {"step_times_s": [0.1, 0.2, 0.15], "step_s": 0.15, "step_s_min": 0.1, "step_s_max": 0.2}
    assert timing.timing_note(old) == "3 timed steps; range 66.7% of the median"
    assert timing.timing_note({"step_times_s": None}) == ""


def test_committed_h100_files_still_display_and_remeasure_as_measured():
    """The files of the first H100 run (warmup 2, exactly 5 steps, no timing summary) print their
    steps and range, and `show` rebuilds their exact measuring command (a fixed 5 steps)."""
    import json
    from pathlib import Path

    from rich.console import Console

    from reportgen.views.measurement import print_measurement
    from reportgen.report.show import commands

    root = Path(__file__).resolve().parents[1] / "results" / "validation" / "measured"
    doc = json.loads(next(root.glob("llama-3.1-8b.h100-sxm.lora.1b40c065.*.json")).read_text())
    assert "steps_run" not in doc["measurement"] and "max_steps" not in doc["settings"]
    console = Console(record=True, width=200)
    print_measurement(doc, None, console=console)
    text = console.export_text()
    assert "timing: 5 timed steps; range 42.6% of the median" in text and "profile" not in text
    cmd = commands({"case": doc["case"], "measurement": doc})["measure"]
    assert "--warmup 2 --steps 5 --max-steps 5 --cap-to-gpu" in cmd and "--profile" not in cmd


def test_gc_pauses_are_counted_per_step_and_only_inside_the_block():
    """The harness records Python's garbage collections inside each timed step (gc.callbacks)."""
    import gc

    from reportgen.measure.timing import GcPauses

    pauses = GcPauses()
    gc.collect()  # outside the block: not counted
    with pauses:
        gc.collect()
        gc.collect(0)
    gc.collect()
    n, seconds = pauses.take()
    assert n == 2 and seconds >= 0.0
    assert pauses.take() == (0, 0.0)  # take() starts a new count
    assert pauses._callback not in gc.callbacks  # the callback is removed when the block ends
