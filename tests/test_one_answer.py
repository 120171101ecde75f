"""One answer everywhere (issue 19): the same verdict and the same recommended setup for the same
question on every page, in ``reportgen advise`` and ``estimate``, in the cards table, the CSV
downloads and the calculator.

The fixture runs the real consumer sweep (estimates and decision-tree walks) into a temporary
results directory and renders its pages with the site's own providers. For a sample of (model,
card) pairs every surface is read back as text and compared with the stored walk (the one
definition of "the recommended setup") and with the estimator's verdict (``estimate/verdict.py``).
For every case of the sweep the GPU pages' and CSV files' verdict and memory cells are compared with
the result file they come from: a page that shows "tight" as "yes", or another total in the device
total column, fails here."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from reportgen import browser, catalog
from reportgen.advise.cards import method_setups, smallest_fit
from reportgen.report.guides import guide_pages
from reportgen.cli import main
from reportgen.estimate import estimate
from reportgen.estimate.search import default_precision
from reportgen.report.pages import gpu_pages, home_pages, model_pages
from reportgen.report.render import load_site, render_page
from reportgen.report.show import setup_flags
from reportgen.report.rows import PRIMARY_SEQ, best_fit, setup_label, site_rows, training_setup
from reportgen.runner import run_estimates
from reportgen.setup import TrainingSetup
from reportgen.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
#: pairs whose walks end every way: fits with a swept setup, fits only with a technique the sweep
#: does not cover (the fused loss: 8B on a 3060 and a T4), tight swept setups, nothing on one card
SAMPLE = [("llama-3.1-8b", "rtx-3060"), ("llama-3.1-8b", "rtx-4090"), ("llama-3.1-8b", "t4"),
          ("llama-3.2-1b", "rtx-4090"), ("llama-3.1-70b", "rtx-4090"), ("qwen2.5-7b", "t4"),
          ("gemma-2-9b", "rtx-3060"), ("llama-3.2-3b", "rtx-3060"), ("tinyllama-1.1b", "t4"),
          ("llama-2-13b", "rtx-3090"), ("mistral-7b-v0.3", "rtx-3060")]


def text_of(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html).strip()


@pytest.fixture(scope="module")
def consumer(tmp_path_factory, consumer_walks):
    results = tmp_path_factory.mktemp("one-answer") / "results"
    sweep = load_sweep(ROOT / "sweeps" / "consumer.yaml")
    run_estimates(sweep, results)
    consumer_walks.copy_into(results)  # write_advice(sweep, results), done once per run (conftest.py)
    site = load_site(results, warn=lambda _: None)
    pages, files = {}, {}
    for provider in (home_pages, gpu_pages, model_pages, guide_pages):
        for p in provider(site):
            pages[p.path] = render_page(p)
            files.update({k: v for k, v in p.files.items() if k.endswith(".csv")})
    walks = {(d["model"], d["gpu"], d["seq"]): d for docs in site.advice.values() for d in docs}
    return {"site": site, "pages": pages, "files": files, "walks": walks, "rows": site_rows(site)}


def _recommended(consumer, model: str, gpu: str) -> dict | None:
    return consumer["walks"][(model, gpu, PRIMARY_SEQ)]["recommended"]


def _cli_json(capsys, *args) -> dict:
    capsys.readouterr()
    assert main([*args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _line(page: str, start: str) -> str:
    lines = [ln for ln in page.splitlines() if ln.startswith(start)]
    assert lines, f"no line starting {start!r}"
    return lines[0]


@pytest.mark.parametrize("model,gpu", SAMPLE)
def test_advise_estimate_and_calculator_give_the_walks_answer(consumer, capsys, model, gpu):
    """``reportgen advise`` recommends the stored walk's setup; ``reportgen estimate`` and the
    calculator call that setup "fits" and its largest micro-batch is at least the recommended one;
    where the walk finds nothing on one card, no method fits there with the tree's recipe."""
    rec = _recommended(consumer, model, gpu)
    doc = _cli_json(capsys, "advise", "--model", model, "--gpu", gpu, "--seq", str(PRIMARY_SEQ))
    assert (doc["recommended"] or {}).get("setup") == (rec or {}).get("setup")
    assert doc["verdict"]["kind"] == consumer["walks"][(model, gpu, PRIMARY_SEQ)]["verdict"]["kind"]
    if rec is None:
        g = catalog.load_gpu(gpu)
        for method in ("full", "lora", "qlora"):
            for s in method_setups(method, PRIMARY_SEQ, default_precision(g)):
                assert not estimate(catalog.load_model(model), g, s, reverse=False).fits, s.short()
        return
    flags = setup_flags(rec["setup"])
    est = _cli_json(capsys, "estimate", "--model", model, "--gpu", gpu, *flags)
    assert est["verdict"] == "fits" and est["fits"] is True, est["verdict_text"]
    assert est["max_batch"] >= rec["setup"]["batch"] and est["max_seq"] >= rec["setup"]["seq"]
    assert rec["verdict"] == "fits" and rec["verdict_text"] == est["verdict_text"]
    out = json.loads(browser.run(json.dumps({"model": model, "gpu": gpu, "setup": rec["setup"]})))
    assert json.loads(out["json"])["verdict"] == "fits" and out["view"]["verdict"] == "fits"
    capsys.readouterr()
    assert main(["estimate", "--model", model, "--gpu", gpu, *flags]) == 0
    assert "\nfits: needs " in capsys.readouterr().out


@pytest.mark.parametrize("model,gpu", SAMPLE)
def test_every_page_gives_the_walks_answer(consumer, model, gpu):
    """The guide's summary, the GPU page's cards table, the home grid, the GPU page's fastest-setup
    table and the model page's "where it fits" table say the same thing about one (model, card): a
    swept setup that fits (verdict "fits", never "tight"), the walk's setup where the sweep has none
    that fits ("not in the sweep", never "nothing fits"), or nothing."""
    pages, rec = consumer["pages"], _recommended(consumer, model, gpu)
    anchor = model.replace(".", "-")
    # the guide: the walk's own summary
    summary = _line(pages[f"guides/{gpu}.md"], f"| [{model}](#{anchor}) |").split(" | ")
    cell = summary[1 + sorted({s for _, g2, s in [(m, g, s) for (m, g, s) in consumer["walks"]
                                                   if (m, g) == (model, gpu)]}).index(PRIMARY_SEQ)]
    if rec is None:
        assert "not on one card" in cell
    else:
        short = setup_label(training_setup({**rec["setup"], "accum": 1}))
        assert f"**fits**: {short}, micro-batch {rec['setup']['batch']}" in cell
    # the cards table (one card there = one card in the walk, for the walk's method)
    cards = _line(pages[f"gpus/{gpu}.md"], f"| {model} |").split(" | ")[1:]
    one_card = {m for m, c in zip(("full", "lora", "qlora"), cards) if c.strip().startswith("one card")}
    if rec is None:
        assert not one_card, cards
    else:
        assert rec["setup"]["method"] in one_card, cards
        order = ("full", "lora", "qlora")  # the walk turns LoRA on only when full does not fit, ...
        assert not one_card & set(order[:order.index(rec["setup"]["method"])]), cards
    # ... and the cards table as the current code computes it (the page renders data/cards_needed.json,
    # which test_cards keeps current)
    m, g = catalog.load_model(model), catalog.load_gpu(gpu)
    fresh = {method: smallest_fit(m, g, method, PRIMARY_SEQ, "none", counts=(1,)) for method in ("full", "lora", "qlora")}
    assert {method for method, fit in fresh.items() if fit} == one_card
    # the home grid, the GPU page's fastest setup and the model page: the swept answer or the walk's
    rows = [r for r in consumer["rows"] if (r["model"], r["gpu"]) == (model, gpu)]
    best = best_fit(rows)
    cells = [_line(pages["index.md"], f"| [{model}]("),
             _line(pages[f"gpus/{gpu}.md"], f"| [{model}](#{anchor}) |"),
             _line(pages[f"models/{model}.md"], f"| [{catalog_label(gpu)}](")]
    home = cells[0].split(" |")[1 + sorted({r["gpu"] for r in consumer["rows"]},
                                           key=catalog.gpu_names().index).index(gpu)]
    for c in (home, *cells[1:]):
        if best is not None:
            assert best["verdict"] == "fits" and best["label"] in text_of(c) and "nothing fits" not in c
            assert rec is not None  # a swept setup fits: so does the walk
        elif rec is not None:
            assert "no swept setup fits" in c and "not in the sweep" in c, c
            assert setup_label(training_setup({**rec["setup"], "accum": 1}), any_mixed=True) in text_of(c)
        else:
            assert "nothing fits" in c and "no swept setup fits" not in c, c
    if best is not None:
        # the tokens/s shown on the home grid and the model page is the highest of the result files'
        # estimates that fit on one card at the primary sequence (what reportgen estimate printed),
        # chosen and formatted here without the pages' view models
        fitting = [x for x in consumer["site"].all_results() if x["case"]["model"] == model
                   and x["case"]["gpu"] == gpu and x["case"]["setup"]["seq"] == PRIMARY_SEQ
                   and x["case"]["setup"].get("gpus", 1) == 1 and x["estimate"]["verdict"] == "fits"]
        top = max(x["estimate"]["time"]["tokens_per_s"] for x in fitting)
        shown = f"{top:,.0f}" if top >= 100 else f"{top:.1f}"
        assert f"{shown} tok/s" in text_of(home), (home, shown)
        assert f"| {shown} |" in cells[2], (cells[2], shown)


def catalog_label(gpu: str) -> str:
    from reportgen.report.rows import gpu_label

    return gpu_label(gpu)


def _case_rows(page: str):
    """(case id, memory cell, verdict cell) of every case table row of a GPU page."""
    header = None
    for line in page.splitlines():
        line = line.strip()
        if line.startswith("| Setup | Batch | Memory GiB"):
            header = [h.strip() for h in line.strip("|").split("|")]
        elif header and line.startswith("| ") and 'class="rg-id"' in line:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            shown = re.search(r'<code class="rg-id">(.*?)</code>', cells[0]).group(1)  # under the setup's label
            yield re.sub(r"<[^>]+>", "", shown), cells[2], cells[header.index("Fits")]


def _stored(consumer) -> dict[str, dict]:
    """Each case's estimate as its result file holds it (what ``reportgen estimate --format json``
    printed for the case), read without the site's view models."""
    return {x["id"]: x["estimate"] for x in consumer["site"].all_results()}


def test_every_case_row_shows_its_own_verdict_and_device_total(consumer):
    """Every case of the sweep on the GPU pages: the memory column is the estimate's device total
    (GiB of 2^30 bytes, one decimal) and the Fits column its verdict with the margin (``yes`` only for
    "fits"), both read from the result file, not from the pages' view models; every 97th case is also
    estimated again, so the stored figures are the estimator's."""
    stored, seen = _stored(consumer), 0
    for gpu in {r["gpu"] for r in consumer["rows"]}:
        for cid, memory, verdict in _case_rows(consumer["pages"][f"gpus/{gpu}.md"]):
            est = stored[cid]
            assert text_of(memory.split("<br>")[0]) == f"{est['memory']['device_total'] / GIB:,.1f}", cid
            margin = (est["capacity"] - est["demand"]) / GIB
            expected = ("yes" if est["verdict"] == "fits" else
                        f"{'tight' if est['verdict'] == 'tight' else 'no'} ({margin:+.1f} GiB)")
            assert text_of(verdict.split("<br>")[0]) == expected, cid
            if seen % 97 == 0:
                case = next(x for x in consumer["site"].all_results() if x["id"] == cid)["case"]
                fresh = estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]),
                                 TrainingSetup(**case["setup"]))
                d = json.loads(json.dumps(fresh.as_dict()))
                assert {k: d[k] for k in est} == est, cid
            seen += 1
    assert seen == len(consumer["rows"])


def test_csv_downloads_carry_the_same_verdict(consumer):
    """The CSV files' verdict, memory and speed columns are the result file's estimate."""
    stored = _stored(consumer)
    for name, text in consumer["files"].items():
        for row in csv.DictReader(io.StringIO(text)):
            est = stored[row["case_id"]]
            assert row["verdict"] == est["verdict"] and row["fits"] == ("true" if est["verdict"] == "fits" else "false")
            for column, key in (("est_device_total_gib", "device_total"), ("est_peak_allocated_gib", "peak_allocated")):
                assert float(row[column]) == pytest.approx(est["memory"][key] / GIB, abs=5e-4, rel=1e-5), (name, column)
            tps = est["time"]["tokens_per_s"]
            assert (row["est_tokens_per_s"] == "") if tps is None else float(row["est_tokens_per_s"]) == pytest.approx(
                tps, rel=1e-3, abs=0.05), name


def test_the_searches_agree_with_the_verdict_on_every_case(consumer):
    """For every case of the sweep: it fits exactly when its largest micro-batch is at least its own,
    and a fitting case's longest sequence reaches its own (or the model's context stops it)."""
    for r in consumer["rows"]:
        fits = r["verdict"] == "fits"
        assert fits == (r["max_batch"] is not None and r["max_batch"] >= r["batch"]), r["id"]
        limit = catalog.load_model(r["model"]).max_position_embeddings
        if limit and r["seq"] > limit:  # past the context the search stops at the context
            assert not fits or r["max_seq"] == limit, r["id"]
        else:
            assert fits == (r["max_seq"] is not None and r["max_seq"] >= r["seq"]), r["id"]
