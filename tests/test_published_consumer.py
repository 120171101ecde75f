"""Published speed rows on consumer cards (``data/consumer_speed.csv``) mapped by
``data/consumer_speed_setups.yaml`` (``reportgen.published.consumer``): the rate follows from the row by
arithmetic, and a mapping that contradicts its row, or names a row that does not exist, is refused."""

import csv
import io
from pathlib import Path

import pytest

from reportgen.errors import UserError
from reportgen.published.consumer import (consumer_speed_rows, elapsed_bounds, eta_rate, number, read_csv, seconds,
                                          tqdm_step_seconds)
from reportgen.published.mapping import Unmapped
from reportgen.published.speed import SpeedRow, compare_speed

DATA = Path(__file__).resolve().parents[1] / "data"
HEADER = list(csv.DictReader(open(DATA / "consumer_speed.csv", encoding="utf-8")).fieldnames)


def _write(tmp_path: Path, rows: list[dict], mapping: str) -> Path:
    with open(tmp_path / "consumer_speed.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, HEADER)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in HEADER})
    (tmp_path / "consumer_speed_setups.yaml").write_text(mapping, encoding="utf-8")
    return tmp_path


ROW = {"row_id": "X1", "url": "https://github.com/o/r/issues/1", "gpu": "RTX 4090", "gpus": "1",
       "model": "meta-llama/Llama-3.2-1B", "value": "2.5", "unit": "s/it", "clock_scope": "tqdm s/it",
       "grade": "A", "tokens_per_step": "16384"}
MAP = """X1:
  model: llama-3.2-1b
  gpu: rtx-4090
  rate: step_time
  setup: {method: lora, batch: 4, seq: 2048, accum: 2, padding: packed}
  assumptions: [packed to 2048]
"""


def test_times_are_read_in_the_sources_units():
    assert seconds("03:08:00", "h:mm:ss") == 3 * 3600 + 8 * 60
    assert seconds("08:04", "mm:ss") == 484
    assert seconds("24.84", "min") == pytest.approx(1490.4)
    assert seconds("27", "s/it (one optimizer step)") == 27
    assert seconds("1.5", "hours") == 5400
    with pytest.raises(ValueError):
        seconds("about an hour", "h")
    assert (number("8.2k"), number("2,722"), number("575.89"), number("1.5M")) == (8200, 2722, 575.89, 1.5e6)
    with pytest.raises(ValueError):
        number("~5")


def test_a_step_time_gives_tokens_of_the_step_over_its_seconds(tmp_path):
    [row] = consumer_speed_rows(_write(tmp_path, [ROW], MAP))
    assert isinstance(row, SpeedRow)
    assert row.published_tokens_per_s == pytest.approx(16384 / 2.5)
    assert row.setup.accum == 2 and row.gpu == "rtx-4090"
    assert any("grade A" in a for a in row.assumptions) and "packed to 2048" in row.assumptions


def test_a_total_time_is_divided_by_its_steps_and_samples_by_their_tokens(tmp_path):
    total = MAP.replace("rate: step_time", "rate: total_time\n  steps: 100")
    [row] = consumer_speed_rows(_write(tmp_path, [{**ROW, "value": "0:10:00", "unit": "h:mm:ss"}], total))
    assert row.published_tokens_per_s == pytest.approx(16384 * 100 / 600)
    samples = MAP.replace("rate: step_time", "rate: samples_per_s")
    [row] = consumer_speed_rows(_write(tmp_path, [{**ROW, "value": "3.0", "unit": "samples/s"}], samples))
    assert row.published_tokens_per_s == pytest.approx(3.0 * 2048)
    per_gpu = MAP.replace("rate: step_time", "rate: tokens_per_s\n  per_gpu: true").replace("accum: 2", "gpus: 2, sharding: ddp")
    [row] = consumer_speed_rows(_write(tmp_path, [{**ROW, "value": "1000", "unit": "tokens/s/GPU"}], per_gpu))
    assert row.published_tokens_per_s == pytest.approx(2000)


@pytest.mark.parametrize("mapping, words", [
    (MAP.replace("accum: 2", "accum: 1"), "8,192 tokens a step"),
    (MAP.replace("  rate: step_time\n", ""), "missing rate"),
    (MAP.replace("batch: 4", "batch: 0"), "setup or libs not valid"),
    (MAP + "Y9:\n  unmapped: gone\n", "row ids not in consumer_speed.csv: Y9"),
    (MAP.replace("rate: step_time", "rate: per_step"), "X1: rate"),
    (MAP.replace("assumptions:", "asumptions:"), "X1: asumptions"),
    (MAP.replace("model: llama-3.2-1b", "model: configs/no-such-model.json"), "X1: model configs/no-such-model.json"),
])
def test_a_mapping_that_contradicts_its_row_is_refused_by_name(tmp_path, mapping, words):
    with pytest.raises(UserError) as e:
        consumer_speed_rows(_write(tmp_path, [ROW], mapping))
    assert words in str(e.value) and "consumer_speed_setups.yaml" in str(e.value)


def test_rows_without_an_entry_or_marked_unmapped_say_why(tmp_path):
    other = {**ROW, "row_id": "X2"}
    rows = consumer_speed_rows(_write(tmp_path, [ROW, other], "X1:\n  unmapped: int8 base not modelled\n"))
    assert [(r.row_id, r.reason) for r in rows] == [("X1", "int8 base not modelled"), ("X2", "no mapping yet")]


def test_every_committed_row_has_an_entry_and_maps():
    rows = consumer_speed_rows(DATA)
    assert {r.row_id for r in rows} == set(read_csv(DATA / "consumer_speed.csv"))
    assert not [r.row_id for r in rows if isinstance(r, Unmapped) and r.reason == "no mapping yet"]


def test_mapped_rows_join_the_published_speed_table(tmp_path):
    rows = consumer_speed_rows(_write(tmp_path, [ROW], MAP))
    out = compare_speed([], rows)
    [r] = out["rows"]
    assert r["id"] == "X1" and r["source"] == ROW["url"] and r["published_tokens_per_s"] == pytest.approx(6553.6)
    assert r["estimated_tokens_per_s"] > 0 and r["rel_error"] == pytest.approx(
        r["estimated_tokens_per_s"] / r["published_tokens_per_s"] - 1, abs=1e-3)


def test_a_config_under_published_configs_is_found_wherever_the_command_runs(tmp_path, monkeypatch):
    """``model: configs/NAME.json`` is the config.json in reportgen/published/configs (not a path relative to
    the current directory), and the speed table names the row's model by the file's name."""
    monkeypatch.chdir(tmp_path)
    mapping = MAP.replace("model: llama-3.2-1b", "model: configs/qwen2.5-0.5b.json")
    [row] = consumer_speed_rows(_write(tmp_path, [ROW], mapping))
    assert Path(row.model).is_file() and Path(row.model).parent.name == "configs"
    [r] = compare_speed([], [row])["rows"]
    assert r["model"] == "qwen2.5-0.5b" and r["estimated_tokens_per_s"] > 0
    [r] = compare_speed([], consumer_speed_rows(_write(tmp_path, [ROW], MAP)))["rows"]
    assert r["model"] == "llama-3.2-1b"  # a catalog name as written (not cut at its last dot)


def test_minutes_left_printed_by_minimind_decode_to_the_elapsed_time():
    """minimind prints ``elapsed / (i + 1) * steps // 60 - elapsed // 60`` minutes left; its author's RTX 2080 Ti
    log (minimind#60: 442, 431, 426 at iterations 100, 200, 300 of 111,769) pins the elapsed time of each print
    to a twentieth of a second, and the seconds per iteration between the first and the last; iterations out of
    order or a rate the prints bound too loosely (late in an epoch a print bounds its time only to seconds)
    are refused."""
    lo, hi = elapsed_bounds(442, 100, 111769)
    assert (lo, hi) == (pytest.approx(23.965, abs=1e-3), pytest.approx(24.019, abs=1e-3))
    assert 0.9 * lo / 101 * 111769 // 60 - 0.9 * lo // 60 < 442 < 1.1 * hi / 101 * 111769 // 60 - 1.1 * hi // 60
    rate, how = eta_rate("442; 431; 426", [100, 200, 300], 111769, 24528)
    assert rate == pytest.approx(24528 / ((69.0769 - 23.9919) / 200), rel=1e-3) and "iterations 100" in how
    with pytest.raises(ValueError, match="one iteration per value"):
        eta_rate("442; 431", [100, 200, 300], 111769, 24528)
    for at in ([100, 100, 300], [-1, 200, 300], [300, 200, 100], [100, 200, 111769]):
        with pytest.raises(ValueError, match="must increase"):
            eta_rate("442; 431; 426", at, 111769, 24528)
    late = [elapsed_bounds(m, i, 111769) for m, i in ((400, 90000), (399, 90100))]
    assert late[0][1] - late[0][0] > 100  # a print late in the epoch bounds its time only to minutes
    with pytest.raises(ValueError, match="apart"):
        eta_rate("400; 399", [90000, 90100], 111769, 24528)
    with pytest.raises(ValueError, match="not a value the formula prints"):
        elapsed_bounds(-1, 100, 111769)  # the formula never prints a negative time


def test_an_eta_mapping_needs_the_epoch_and_the_iterations(tmp_path):
    eta = MAP.replace("rate: step_time", "rate: eta_minutes\n  steps: 1000")
    with pytest.raises(UserError, match="missing at"):
        consumer_speed_rows(_write(tmp_path, [{**ROW, "value": "5; 4"}], eta))


def test_tqdm_s_it_early_in_a_run_is_undone_to_the_step_s_own_seconds():
    """tqdm shows a start-corrected exponential average (smoothing 0.3), not the last step: a bar made as
    transformers' ``ProgressCallback`` makes it, stepped through 3, 2 and 1.5 s, shows 3, 2.41 and 2.03 s/it,
    and ``tqdm_step_seconds`` recovers each step; llmq's 4 x 4090 log (5.89 then 5.08 s/it after steps 1 and 2)
    is a step 2 of 4.513 s, not 5.08."""
    from tqdm import tqdm

    now = [0.0]
    bar = tqdm(total=9, dynamic_ncols=True, file=io.StringIO())
    bar._time, bar.start_t, bar.last_print_t = (lambda: now[0]), 0.0, 0.0
    steps, shown = (3.0, 2.0, 1.5), []
    for dt in steps:  # a first step of 3 s (with its warm-up), then 2 s and 1.5 s
        now[0] += dt
        bar.update(1)
        shown.append(1 / bar.format_dict["rate"])
    assert shown[0] == pytest.approx(3.0) and shown[1] == pytest.approx(2.0 * 0.3 / 0.51 + 3.0 * 0.21 / 0.51)
    assert shown[2] != pytest.approx(1.5, rel=0.05)  # still not the step's own time at step 3
    assert [tqdm_step_seconds(shown[k - 1], shown[k - 2] if k > 1 else 0.0, k) for k in (1, 2, 3)] == [
        pytest.approx(t) for t in steps]
    assert tqdm_step_seconds(5.08, 5.89, 2) == pytest.approx(4.513, abs=1e-3)


def test_a_tqdm_mapping_reads_each_value_from_its_step_s_line_in_the_quote(tmp_path):
    """Both readings must be the bar's lines for steps k and k - 1 in the row's quote: a number the source did
    not print, two readings swapped, another step, or a number inside a longer one are refused."""
    tq = MAP.replace("rate: step_time", 'rate: tqdm_step\n  steps: 2\n  previous: "3.00"')
    quote = "1/9 [00:03<00:24,  3.00s/it]\n2/9 [00:05<00:16,  2.41s/it]"
    row = {**ROW, "value": "2.41", "quote": quote}
    [r] = consumer_speed_rows(_write(tmp_path, [row], tq))
    assert r.published_tokens_per_s == pytest.approx(16384 / (1.7 * 2.41 - 0.7 * 3.0))
    assert "step 2's own time" in r.derivation and "at 0.41" in r.derivation
    for mapping, value, words in (
            (tq.replace('"3.00"', '"3.10"'), "2.41", "3.00 s/it at step 1, not 3.10"),
            (tq.replace('"3.00"', '"2.41"'), "3.00", "2.41 s/it at step 2, not 3.00"),  # swapped
            (tq.replace("steps: 2", "steps: 3"), "2.41", "no line at step 3"),
            (tq, "1.41", "2.41 s/it at step 2, not 1.41")):
        with pytest.raises(UserError, match=words):
            consumer_speed_rows(_write(tmp_path, [{**row, "value": value}], mapping))
    longer = {**row, "quote": quote.replace(" 2.41s/it", "12.41s/it")}  # 2.41 only inside 12.41
    with pytest.raises(UserError, match="12.41 s/it at step 2, not 2.41"):
        consumer_speed_rows(_write(tmp_path, [longer], tq))
    with pytest.raises(UserError, match="missing previous"):
        consumer_speed_rows(_write(tmp_path, [row], tq.replace('\n  previous: "3.00"', "")))
    fast = {**row, "quote": "1/9 [00:09<01:12,  9.00s/it]\n2/9 [00:10<00:16,  2.41s/it]"}
    with pytest.raises(UserError, match="leave no time"):
        consumer_speed_rows(_write(tmp_path, [fast], tq.replace('"3.00"', '"9.00"')))
