"""Issue 32, a dataset's lengths: ``--lengths FILE`` (``datalengths.py``) sets the cut, the mean and the
padded length of a micro-batch from the dataset itself (``estimate/lengths.empirical_longest``), reports
the padding waste and what to do about it, and refuses a bad file with its file and line."""

from __future__ import annotations

import json

import pytest

from reportgen.cli import main
from reportgen.datalengths import read_lengths
from reportgen.errors import UserError
from reportgen.estimate.lengths import empirical_longest


def test_the_expected_longest_of_a_batch_from_a_histogram():
    """Two lengths, 100 and 200 tokens, one sample each: a batch of two draws is 100 long only when both
    draws are 100 (1/4), so E[max] = 100/4 + 200 * 3/4 = 175; a batch of one is the mean; a cut at 150
    makes the 200 a 150."""
    assert empirical_longest((100, 200), (1, 1), 1000, 2) == pytest.approx(175)
    assert empirical_longest((100, 200), (1, 1), 1000, 1) == pytest.approx(150)
    assert empirical_longest((100, 200), (1, 1), 150, 2) == pytest.approx(100 / 4 + 150 * 3 / 4)


@pytest.mark.parametrize("text", ["300\n300\n900\n", "300 2\n# a comment\n900\n", "300,2\n\n900, 1\n",
                                  "[300, 300, 900]", '{"300": 2, "900": 1}'])
def test_every_format_reads_the_same_histogram(tmp_path, text):
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    lengths = read_lengths(path)
    assert (lengths.values, lengths.counts) == ((300, 900), (2, 1))
    assert lengths.mean() == 500 and lengths.mean(600) == 400 and lengths.share_over(600) == pytest.approx(1 / 3)


@pytest.mark.parametrize("text, message", [
    ("300\n-5\n", ":2: tokens -5 is out of range"),
    ("300\nlots\n", ":2: 'lots' is not a number"),
    ("300\n1e9\n", "out of range (1 to 16,777,216)"),
    ("300\n1.5\n", "not a whole number"),
    ("300 2 7\n", ":1: '300 2 7' has 3 values"),
    ("# only a comment\n", "no sample lengths"),
    ("[300, true]", "item 2: 'true' is not a number"),
    ('{"300": -1}', "samples -1 is out of range"),
    ('"300"', "is not a number"),
    ("[300,", "not valid JSON"),
])
def test_a_bad_lengths_file_is_an_error_naming_its_line(tmp_path, text, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(UserError) as exc:
        read_lengths(path)
    assert message in exc.value.message and str(path) in exc.value.message


def test_a_missing_or_binary_file_is_an_error(tmp_path, capsys):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--lengths", str(tmp_path / "no")]) == 2
    assert "cannot read the lengths file" in capsys.readouterr().err
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--lengths", str(tmp_path / "bin")]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def _estimate(capsys, *args):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_skewed_dataset_sets_the_cut_the_mean_and_the_padded_length(tmp_path, capsys):
    """Mostly short samples and a few long ones (a skewed set): memory follows the longest, the speed the
    padded batches, the throughput the real tokens; packing and a cut are suggested."""
    path = tmp_path / "lengths.txt"
    path.write_text("200 980\n4000 20\n")
    d = _estimate(capsys, "--lengths", str(path), "--batch", "8")
    setup, r = d["setup"], d["lengths"]
    assert setup["seq"] == 4000 and setup["seq_mean"] == round((200 * 980 + 4000 * 20) / 1000) == 276
    expected = empirical_longest((200, 4000), (980, 20), 4000, 8)  # 200 + 3800 (1 - 0.98^8)
    assert expected == pytest.approx(200 + 3800 * (1 - 0.98 ** 8))
    assert setup["seq_padded"] == round(expected) and r["padded_length"] == pytest.approx(expected)
    assert r["padding_waste"] == pytest.approx(1 - 276 / expected, abs=1e-3)
    assert r["p99_5"] == 4000 and r["cut_share"] == 0
    # the time model reads the dataset's padded length, not the exponential model's: 2 % of samples at
    # 4,000 tokens pad a batch of 8 more often than an exponential distribution of the same mean would
    plain = _estimate(capsys, "--batch", "8", "--seq", "4000", "--seq-mean", "276")
    assert d["time"]["step_s"] > plain["time"]["step_s"] and d["time"]["tokens_per_s"] < plain["time"]["tokens_per_s"]
    cut = _estimate(capsys, "--lengths", str(path), "--batch", "8", "--seq", "1024")
    assert cut["setup"]["seq"] == 1024 and cut["lengths"]["cut_share"] == pytest.approx(0.02)
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--batch", "8", "--lengths", str(path)]) == 0
    out = capsys.readouterr().out
    assert "are padding" in out and "packing (--padding packed) would cut the padding waste" in out


@pytest.mark.parametrize("command", ["estimate", "trace"])
@pytest.mark.parametrize("flag", ["--seq-mean", "--seq-padded"])
def test_a_mean_given_beside_a_lengths_file_is_refused(tmp_path, capsys, command, flag):
    """``--lengths`` sets seq_mean and seq_padded from the samples; a flag beside it was silently dropped."""
    path = tmp_path / "lengths.txt"
    path.write_text("200 980\n4000 20\n")
    argv = [command, "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--padding", "longest", "--lengths", str(path),
            flag, "300"]
    assert main(argv) == 2
    assert f"{flag}: --lengths {path} gives it" in " ".join(capsys.readouterr().err.split())


def test_seq_padded_is_checked_like_every_setup_field(capsys):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq-padded", "500"]) == 2
    assert "needs padding longest and seq_mean" in capsys.readouterr().err
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq", "1000", "--seq-mean", "400",
                 "--seq-padded", "1200"]) == 2
    assert "lies between seq_mean (400) and seq (1000)" in capsys.readouterr().err


def test_advise_walks_at_the_longest_sample_and_prices_the_padding_of_its_recommendation(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("300 990\n1500 9\n6000 1\n")
    assert main(["advise", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--lengths", str(path), "--format",
                 "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    r = doc["lengths"]
    assert doc["seq"] == 6000 and r["cap"] == 6000 and r["setup"] == doc["recommended"]["setup"]
    assert r["p99_5"] == 1500 and r["p99_5_cut_share"] == pytest.approx(0.001)
    assert main(["advise", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--lengths", str(path)]) == 0
    out = capsys.readouterr().out
    assert "cutting at 1,500 tokens (--seq 1500) would cut 0.1% of the samples" in out


def test_the_reserve_follows_the_longest_micro_batch_seen_so_far(tmp_path, capsys):
    """The caching allocator keeps the blocks of the largest step it ran: with 2 % of samples at 4,000 tokens
    the first step's batch of 4 is most likely short, and by step 500 one of the 2,000 samples seen is long,
    so the reserve has grown to the step at the cut (the estimate's own peak reserved)."""
    from reportgen.estimate.lengths import longest_of

    assert longest_of((100, 200), (1, 1), 1000, 1) == 100  # F(100) = 1/2: the median of one draw
    assert longest_of((100, 200), (1, 1), 1000, 2) == 200  # F(100)^2 = 1/4 < 1/2
    assert longest_of((100, 200), (1, 1), 150, 2) == 150  # cut
    path = tmp_path / "lengths.txt"
    path.write_text("200 980\n4000 20\n")
    d = _estimate(capsys, "--lengths", str(path), "--batch", "4", "--method", "lora")
    growth = d["lengths"]["reserved_growth"]
    assert growth["first"]["longest"] == 200 and growth["500"]["longest"] == 4000
    assert growth["first"]["peak_reserved"] < growth["500"]["peak_reserved"] == d["memory"]["peak_reserved"]
    # the first optimizer step is its accum micro-batches: 4 x 64 samples hold a long one (0.98^256 < 1/2)
    accum = _estimate(capsys, "--lengths", str(path), "--batch", "4", "--accum", "64", "--method", "lora")
    assert accum["lengths"]["reserved_growth"]["first"]["longest"] == 4000
    packed = _estimate(capsys, "--lengths", str(path), "--padding", "packed")
    assert "reserved_growth" not in packed["lengths"]  # packed rows are all seq long: no growth


def test_grouping_by_length_pads_as_transformers_length_grouped_sampler(tmp_path, capsys):
    """``group_by_length`` (transformers' ``get_length_grouped_indices``): mega-batches of sorted samples, each
    micro-batch padded to its longest. Worked example: 10, 10, 10, 100 in pairs -> 55 tokens per row; on a skewed set
    it pads far less than random micro-batches and never below the mean; the estimate says what it would save."""
    from reportgen.datalengths import Lengths
    from reportgen.estimate.lengths import grouped_padded_length

    assert grouped_padded_length(Lengths((10, 100), (3, 1)), 1000, 2) == 55
    skewed = Lengths((64, 512, 2048), (900, 90, 10))
    grouped = grouped_padded_length(skewed, 4096, 8)
    assert skewed.mean() < grouped < 0.5 * empirical_longest(skewed.values, skewed.counts, 4096, 8)
    assert grouped_padded_length(skewed, 256, 8) <= 256  # the cut applies first
    path = tmp_path / "lengths.txt"
    path.write_text("64 900\n512 90\n2048 10\n")
    d = _estimate(capsys, "--lengths", str(path), "--batch", "8", "--method", "lora")
    waste = d["lengths"]["waste_by_padding"]
    assert waste["grouped"] < d["lengths"]["padding_waste"] == waste["longest"]
    main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "lora", "--batch", "8",
          "--lengths", str(path)])
    out = " ".join(capsys.readouterr().out.split())
    assert "grouping by length (group_by_length: true" in out and "puts the longest micro-batch first" in out
