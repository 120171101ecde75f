"""The comparison with published measurements: every row is mapped or has a reason, and the
estimate predicts the same measure the row reports."""

import json
import shutil
import statistics

import pytest
from pathlib import Path

from reportgen.cli import main
from reportgen.published.compare import compare
from reportgen.published.mapping import Mapped, Unmapped, map_row, read_rows

CSV = Path("data/published_measurements.csv")


def test_every_row_mapped_or_explained():
    rows = read_rows(CSV)
    assert len(rows) == 82
    for row in rows:
        m = map_row(row)
        assert isinstance(m, (Mapped, Unmapped))
        if isinstance(m, Unmapped):
            assert len(m.reason) > 10


def test_measures_follow_the_source():
    by_id = {r["id"]: map_row(r) for r in read_rows(CSV)}
    assert by_id["R003"].measure == "reserved" and by_id["R003"].unit == "GiB"  # fsdp_qlora: reserved GiB
    assert by_id["R070"].measure == "allocated" and by_id["R070"].unit == "GB"  # litgpt: allocated / 1e9
    assert by_id["R202"].measure == "loss-forward-backward"
    assert isinstance(by_id["R143"], Unmapped)  # BERT


def test_fsdp_qlora_defaults_from_its_train_py():
    """train.py: pure bf16, r64, NF4 with bitsandbytes' default double quantization (Linear4bit's
    compress_statistics=True: train.py does not pass it), reentrant checkpointing, FSDP on 2 GPUs, its
    'output' kept until after optimizer.step(); 'DDP-mode' is FSDP NO_SHARD."""
    rows = {r["id"]: r for r in read_rows(CSV)}
    setup = map_row(rows["R001"]).setup
    assert (setup.method.value, setup.precision.value, setup.lora_rank, setup.quant.value, setup.double_quant,
            setup.grad_ckpt, setup.gpus, setup.sharding.value, setup.keep_outputs.value) == (
        "qlora", "bf16", 64, "nf4", True, True, 2, "fsdp", "step")
    assert map_row(rows["R009"]).setup.sharding.value == "no-shard"
    assert map_row(rows["R001"]).libs.returned_logits_fp32  # transformers 4.38


@pytest.mark.parametrize("row_id, key, text", [("R001", "batch", "eight"), ("R001", "seq_len", "n/a"),
                                               ("R070", "gpus", "several")])
def test_a_count_cell_that_is_not_a_number_is_not_read_as_the_default(row_id, key, text):
    """A blank cell is the recipe's default; a cell with words was taken as that default too (``or 1``),
    so a damaged row compared a setup its source never ran."""
    row = dict({r["id"]: r for r in read_rows(CSV)}[row_id], **{key: text})
    m = map_row(row)
    assert isinstance(m, Unmapped) and m.reason == f"not a whole number of 1 or more: {key} {text!r}"


def test_litgpt_recipe_from_its_code():
    """litgpt's loop keeps the previous logits (fp32 from Fabric) into the next forward, QLoRA trains
    with bitsandbytes' 32-bit PagedAdamW, full fine-tuning accumulates to its config's global batch,
    and a figure below what its own recipe needs for parameter state is not compared."""
    rows = {r["id"]: r for r in read_rows(CSV)}
    q = map_row(rows["R090"])
    assert (q.setup.keep_outputs.value, q.setup.optimizer.value, q.setup.loss.value) == (
        "next-step", "paged-adamw", "standard")
    assert q.libs.returned_logits_fp32 and q.libs.bnb_4bit_holds_input
    assert map_row(rows["R088"]).setup.accum == 8  # micro-batch 4, global batch 32
    phi3_full = map_row(rows["R082"])
    assert isinstance(phi3_full, Unmapped) and "8 bytes per parameter" in phi3_full.reason


def test_litgpt_builds_a_separate_head_for_a_tied_model():
    """litgpt's GPT never ties lm_head to the embedding (convert_hf_checkpoint copies it): Gemma 2 9B
    trains with 256,000 x 3,584 more weights, a head that bnb.nf4 quantizes (the dequantized head is
    the largest transient); the same model from fsdp_qlora or the catalog keeps its tied head."""
    from reportgen import catalog
    from reportgen.estimate import params as P

    rows = {r["id"]: r for r in read_rows(CSV)}
    gemma = map_row(rows["R069"])
    tied = catalog.load_model("gemma-2-9b")
    assert tied.tie_word_embeddings and not gemma.spec.tie_word_embeddings
    assert gemma.spec.total_params == tied.total_params + 256_000 * 3_584
    assert P.head_quantized(gemma.spec, gemma.setup) and not P.head_quantized(tied, gemma.setup)
    assert map_row(rows["R001"]).spec == catalog.load_model("llama-2-7b")  # not litgpt: unchanged


def test_loss_only_rows_are_mib_with_gemma2_softcapping():
    """apple/ml-cross-entropy's op_mem_mb is bytes / 2**20: the estimator's 12 and 14 bytes per logit
    (bf16 logits, soft-capped copy, fp32 copy, log-softmax; backward adds the gradient) of 8,192 x
    256,000 are exactly 24,000 and 28,000 MiB."""
    rows = {r["id"]: r for r in compare(CSV)["rows"]}
    assert rows["R201"]["unit"] == "MiB" and rows["R201"]["published"] == 24000
    assert rows["R201"]["estimated"] == pytest.approx(24000, abs=0.1)  # + the int64 targets, 1/16 MiB
    assert rows["R202"]["estimated"] == pytest.approx(28000, abs=0.1)


def test_a_figure_printed_in_two_gpus_tables_is_one_measurement():
    """fsdp_qlora prints the memory of its RTX 3090 runs again in its RTX 4090 tables: seven such
    pairs count once; litgpt's Llama 3 and 3.1 8B rows (one GPU, two runs, one figure) stay two."""
    rows = {r["id"]: r for r in compare(CSV)["rows"]}
    pairs = {r["id"]: r["same_as"] for r in rows.values() if r["same_as"]}
    assert pairs == {"R006": ["R018"], "R008": ["R015"], "R009": ["R017"], "R010": ["R014"], "R011": ["R020"],
                     "R012": ["R021"], "R013": ["R022"]}
    assert not {"R014", "R015", "R017", "R018", "R020", "R021", "R022"} & set(rows)
    assert {"R073", "R075"} <= set(rows) and rows["R073"]["published"] == rows["R075"]["published"]
    assert {"R016", "R019", "R023"} <= set(rows)  # 4090-only runs are not merged with anything


def test_cli_table_cells_are_not_cut_inside_words(tmp_path, capsys):
    """Every word of every technique cell is printed whole (the table wraps between words), and the
    model column names the catalog model the row was mapped to."""
    assert main(["compare-published", "--out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "…" not in out  # no cell shortened with an ellipsis
    cells = [c.strip() for line in out.splitlines() if line.startswith("│") for c in line.split("│")[1:-1]]
    printed = {w for c in cells for w in c.split()}
    for r in compare(CSV)["rows"]:
        words = [w for w in r["technique"].split() if len(w) <= 24]  # a longer word cannot fit its column
        assert set(words) <= printed, (r["id"], set(words) - printed)
        assert r["model_as"] in printed


def test_compare_summary_and_cli_json(tmp_path):
    """The headline figures are the medians of the rows the table lists (the error against the
    published rows themselves is bounded in test_accuracy.py), each row's error is its own published
    and estimated figures', and the CLI writes that comparison."""
    summary = compare(CSV)
    rows = summary["rows"]
    assert len(rows) == 35
    assert summary["median_abs_error_gb"] == round(statistics.median(r["abs_error_gb"] for r in rows), 4)
    assert summary["median_rel_error"] == round(statistics.median(r["rel_error"] for r in rows), 4)
    for r in rows:
        assert r["rel_error"] == pytest.approx(r["estimated"] / r["published"] - 1, abs=1e-4), r["id"]
    ids = {r["id"] for r in rows}
    assert {"R003a", "R004a"} <= ids  # the allocated figures quoted in fsdp_qlora's text
    out = tmp_path / "cmp.json"
    assert main(["compare-published", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(json.dumps(summary))


def test_stored_comparison_is_what_the_estimator_says_now():
    """data/published_comparison.json (``reportgen compare-published``) records the hash of what it was
    computed from (the published rows, the estimator's and the mapping's code, the catalogs) and is
    current by it, as every artifact is judged: an estimator, mapping, catalog or CSV change fails here
    until the command is rerun, so the validation page never publishes a stale comparison."""
    from reportgen.artifacts import Artifact
    from reportgen.published.compare import comparison_inputs_hash

    path = Path("data/published_comparison.json")
    stored = json.loads(path.read_text())
    assert Artifact("published", path, comparison_inputs_hash(CSV)).is_current(stored), \
        "stale: run `reportgen compare-published`"
    assert stored == json.loads(json.dumps(compare(CSV))), "stale: run `reportgen compare-published`"


def test_comparison_hash_moves_with_the_published_rows(tmp_path):
    """Another row, or another figure of a row, is another comparison."""
    from reportgen.published.compare import comparison_inputs_hash

    edited = tmp_path / "rows.csv"
    edited.write_text(CSV.read_text(encoding="utf-8").replace("4.98", "4.99", 1), encoding="utf-8")
    assert comparison_inputs_hash(edited) != comparison_inputs_hash(CSV)


def test_the_validation_page_warns_when_the_comparison_is_stale(tmp_path, capsys):
    """Rendering with a comparison computed from other rows (or code, or catalog entries) prints how to
    recompute it, as the cards table does; the page still shows the file it has."""
    from reportgen.report.pages import _published

    shutil.copy(CSV, tmp_path / CSV.name)
    for beside in ("consumer_speed.csv", "consumer_speed_setups.yaml"):  # their rows join the speed table
        shutil.copy(CSV.parent / beside, tmp_path / beside)
    shutil.copy("data/published_comparison.json", tmp_path / "published_comparison.json")
    stored = _published(tmp_path / "published_comparison.json")
    assert capsys.readouterr().err == ""  # the committed pair is current
    (tmp_path / CSV.name).write_text(CSV.read_text(encoding="utf-8").replace("4.98", "4.99", 1), encoding="utf-8")
    assert _published(tmp_path / "published_comparison.json") == stored
    err = capsys.readouterr().err
    assert "published_comparison.json was computed by other code, catalog entries or published rows" in err
    assert "run `reportgen compare-published`" in err
    (tmp_path / CSV.name).write_text(CSV.read_text(encoding="utf-8"), encoding="utf-8")  # current again
    _published(tmp_path / "published_comparison.json")
    assert capsys.readouterr().err == ""
    mapping = tmp_path / "consumer_speed_setups.yaml"  # a changed consumer-speed mapping is stale too
    mapping.write_text(mapping.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    _published(tmp_path / "published_comparison.json")
    assert "run `reportgen compare-published`" in capsys.readouterr().err
    # a truncated copy: a warning, and the page goes without the comparison (no traceback)
    (tmp_path / "published_comparison.json").write_text('{"rows": [')
    assert _published(tmp_path / "published_comparison.json") is None
    err = capsys.readouterr().err
    assert "published_comparison.json: not valid JSON at line 1" in err
    assert "the site goes without the validation page's comparison with published measurements; run `reportgen compare-published`" in err


def test_litgpt_rows_take_lora_settings_and_library_versions_from_their_configs():
    """The CSV leaves rank, dropout and targets blank for most litgpt rows; the mapping reads them
    from the row's own config (tiny-llama/qlora.yaml: r32, dropout 0.05, on q, k, v, the projection,
    the MLP and the head) and estimates with the bitsandbytes litgpt pinned then, whose 4-bit matmul
    kept its input."""
    by_id = {r["id"]: map_row(r) for r in read_rows(CSV)}
    tiny_q = by_id["R090"]
    assert (tiny_q.setup.lora_rank, tiny_q.setup.lora_dropout, tiny_q.setup.lora_targets) == (
        32, 0.05, "q,k,v,o,mlp,lm_head")
    assert tiny_q.libs.bnb_4bit_holds_input and by_id["R001"].libs.bnb_4bit_holds_input
    assert by_id["R071"].setup.lora_targets == "q,v" and by_id["R071"].setup.lora_rank == 32
    assert by_id["R088"].setup.method.value == "full" and by_id["R088"].setup.lora_dropout == 0.0
    rows = {r["id"]: r for r in compare(CSV)["rows"]}
    assert rows["R090"]["bitsandbytes"] == "0.42.0"
    assert any("tiny-llama/qlora.yaml" in a for a in rows["R090"]["assumptions"])


def test_fsdp_qlora_hardware_table_runs_reach_an_effective_batch_of_32():
    """The hardware table trained to an effective batch of 32 "or the closest we could get": R031
    runs 4 per GPU on 4 GPUs, so accumulation 2 (speed.py)."""
    from reportgen.published.speed import map_speed_row

    rows = {r["id"]: r for r in read_rows(CSV)}
    r031 = map_speed_row(rows["R031"])
    assert (r031.gpu, r031.setup.gpus, r031.setup.accum) == ("a100-40gb", 4, 2)
    assert isinstance(map_speed_row(rows["R070"]), Unmapped)  # litgpt states runtime per epoch, not tokens
    r026 = map_speed_row(rows["R026"])  # "A5000 24GB": refused as "not in the catalog" until 2026-11-29
    assert (r026.gpu, r026.setup.gpus, r026.setup.batch, r026.setup.accum) == ("rtx-a5000", 4, 1, 8)


def test_a_catalog_model_is_never_called_an_unsupported_architecture():
    """Issue 19: gemma-2b, gemma-7b and phi-2 rows were "architecture not supported" though the catalog
    has them; an unmapped row of a catalog model says what is missing instead."""
    from reportgen import catalog

    repos = {catalog.load_model(n).hf_repo.lower() for n in catalog.model_names() if catalog.load_model(n).hf_repo}
    for row in read_rows(CSV):
        m = map_row(row)
        if isinstance(m, Unmapped) and row["model"].strip().lower() in repos:
            assert "architecture not supported" not in m.reason, (row["id"], m.reason)


@pytest.mark.parametrize("change, says", [
    ({"gpus": "two"}, "not a whole number of 1 or more: gpus 'two'"),
    ({"seq_len": "0"}, "not a whole number of 1 or more: seq_len '0'"),
    ({"batch": "0"}, "not a whole number of 1 or more: batch '0'"),
    ({"peak_mem_gb": "0"}, "not a positive number: peak_mem_gb '0'"),
    ({"peak_mem_gb": "-4.98"}, "not a positive number: peak_mem_gb '-4.98'"),
    ({"peak_mem_gb": "nan"}, "not a positive number: peak_mem_gb 'nan'"),
    ({"tokens_per_s": "-100"}, "not a positive number: tokens_per_s '-100'"),
    ({"notes": None}, "of the header's"),  # a short row: DictReader fills the missing cells with None
])
def test_a_damaged_row_is_named_with_its_reason_not_a_traceback(tmp_path, capsys, change, says):
    """compare-published stopped with ValueError/ZeroDivisionError/TypeError on such rows (a CLI probe)."""
    rows = read_rows(CSV)
    header = list(rows[0].keys())
    row = dict(rows[0], **change)
    path = tmp_path / "bad.csv"
    cells = ['"' + str(row[k]).replace('"', '""') + '"' for k in header if row[k] is not None]
    path.write_text(",".join(header) + "\n" + ",".join(cells) + "\n")
    assert main(["compare-published", "--csv", str(path), "--out", str(tmp_path / "c.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"{rows[0]['id']}: " in out and says in out


@pytest.mark.parametrize("doc, says", [
    ({}, "it compares no row"),
    ({"rows": 5}, "rows is not a list"),
    ({"rows": [{"id": "X"}]}, "rows[0] lacks or mistypes source"),
    ({"rows": [], "speed": {"rows": [{"id": "X"}]}}, "speed.rows[0] lacks or mistypes model"),
])
def test_a_comparison_the_pages_cannot_show_is_said_and_left_out(doc, says):
    """render stopped with a TypeError on a comparison compare-published wrote from a CSV with no mapped
    row, and on hand-edited ones."""
    from reportgen.report.pages import published_problem

    assert says in published_problem(doc)
    assert published_problem(json.loads(Path("data/published_comparison.json").read_text())) is None


def test_render_refuses_a_published_file_that_is_not_there(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    assert main(["render", "--results", str(tmp_path / "results"), "--docs", str(tmp_path / "docs"),
                 "--published", str(tmp_path / "nosuch.json")]) == 2
    assert "--published" in capsys.readouterr().err and not (tmp_path / "docs").exists()


def test_a_repeated_id_is_compared_once_and_named(tmp_path, capsys):
    """Two rows with one id were both compared (a pasted copy counted twice in every median)."""
    text = CSV.read_text()
    header, first = text.splitlines()[:2]
    path = tmp_path / "dup.csv"
    path.write_text(f"{header}\n{first}\n{first}\n")
    assert main(["compare-published", "--csv", str(path), "--out", str(tmp_path / "c.json")]) == 0
    out = json.loads((tmp_path / "c.json").read_text())
    assert [r["id"] for r in out["rows"]] == ["R001"] and len(out["speed"]["rows"]) == 1
    assert any(u["reason"] == "the id of row 1 again (row 2): an id names one row" for u in out["unmapped"])


def test_a_quote_left_open_is_an_error_at_its_line(tmp_path, capsys):
    """An unterminated quote made one cell of the rest of the file, reported as the row's id."""
    header = CSV.read_text().splitlines()[0]
    path = tmp_path / "open.csv"
    path.write_text(f'{header}\n"R900,src\nR901,x\n')
    assert main(["compare-published", "--csv", str(path), "--out", str(tmp_path / "c.json")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}:3: cannot be read as CSV" in err and "quotes doubled" in err
