"""The technique pages: every slug, the trade-off table, docstrings from the code, and worked examples
from pairs of stored cases that differ only in the technique."""

from __future__ import annotations

import pytest

from reportgen.report.page import SiteData
from reportgen.report.techniques import BY_SLUG, TECHNIQUES, PairSpec, find_pairs, technique_pages
from reportgen.setup import TrainingSetup
from tests.test_advise import build_fixture, make_site, render

SLUGS = ("mixed-precision", "lora", "qlora", "gradient-checkpointing", "gradient-accumulation",
         "8bit-paged-optimizers", "cpu-offload", "fsdp", "flash-attention", "fused-cross-entropy",
         "liger-kernels")


@pytest.fixture(scope="module")
def fixture_site(tmp_path_factory):
    return build_fixture(tmp_path_factory.mktemp("techniques"))[0]


def test_every_required_technique_has_a_page(fixture_site):
    pages = technique_pages(fixture_site)
    assert [p.path for p in pages] == ["techniques/index.md"] + [f"techniques/{s}.md" for s in SLUGS]
    texts = {p.path: render(p) for p in pages}
    index = texts["techniques/index.md"]
    for t in TECHNIQUES:
        assert f"]({t.slug}.md)" in index
    for slug in SLUGS:
        text = texts[f"techniques/{slug}.md"]
        for heading in ("## What it does", "## Napkin math", "## In the decision tree",
                        "## Worked examples from the stored results", "## Pitfalls", "## Sources"):
            assert heading in text, (slug, heading)
        assert "No case has been measured yet" in text
        assert "{{" not in text and "{%" not in text


def test_worked_examples_come_from_stored_pairs(fixture_site):
    page = next(p for p in technique_pages(fixture_site) if p.path == "techniques/qlora.md")
    lora_vs_qlora = page.context["examples"][0]
    assert lora_vs_qlora["n"] > 0 and lora_vs_qlora["examples"]
    for e in lora_vs_qlora["examples"]:
        assert e["off_label"].startswith("LoRA") and e["on_label"].startswith("QLoRA")
        assert e["on_mem"] < e["off_mem"]
    text = render(page)
    assert "stored pairs" in text and "LoRA vs QLoRA" in text
    # the stored walks add pairs the sweep grid does not have (fused loss, eager vs SDPA, fp32)
    for slug in ("fused-cross-entropy", "flash-attention", "mixed-precision"):
        page = next(p for p in technique_pages(fixture_site) if p.path == f"techniques/{slug}.md")
        assert page.context["examples"][0]["n"] > 0, slug


def test_pages_without_results_suggest_the_estimate_commands():
    pages = technique_pages(SiteData(results={}, reportgen_version="test", git_commit=None))
    text = render(next(p for p in pages if p.path == "techniques/lora.md"))
    assert "No stored pair yet" in text and "reportgen estimate --model llama-3.2-1b" in text


def _case(id, **setup):
    return {"id": id, "model": "m", "gpu": "g", "setup": TrainingSetup(**setup).model_dump(mode="json"),
            "device_total": 10, "tokens_per_s": 1.0, "fits": True, "measured": None, "source": "x"}


def test_find_pairs_requires_everything_else_equal():
    spec = BY_SLUG["gradient-checkpointing"].pairs[0]
    cases = [_case("a", method="lora"), _case("b", method="lora", grad_ckpt=True),
             _case("c", method="lora", grad_ckpt=True, batch=2), _case("d", method="qlora", grad_ckpt=True)]
    assert [(a["id"], b["id"]) for a, b in find_pairs(spec, cases)] == [("a", "b")]
    spec = PairSpec("x", frozenset({"batch"}), off=lambda s: True, on=lambda s: True,
                    both=lambda a, b: a["batch"] == 4 * b["batch"])
    cases = [_case("big", batch=4), _case("small", batch=1), _case("other", batch=2)]
    assert [(a["id"], b["id"]) for a, b in find_pairs(spec, cases)] == [("big", "small")]


def test_measured_pairs_get_their_own_column(fixture_site):
    results = {name: [dict(r) for r in rs] for name, rs in fixture_site.results.items()}
    ckpt = {}
    for r in results["fixture"]:
        s = r["case"]["setup"]
        if r["case"]["model"] == "llama-3.2-1b" and r["case"]["gpu"] == "rtx-4090" and s["method"] == "qlora":
            r["measurement"] = {"status": "ok", "device_total": (9 if s["grad_ckpt"] else 11) * 2**30,
                                "tokens_per_s": 5000.0, "fake": True,
                                "environment": {"device": "cuda", "gpu_catalog_key": "rtx-4090"}}
            ckpt[s["grad_ckpt"]] = r["id"]
    assert len(ckpt) == 2
    site = make_site(results, fixture_site.advice)
    page = next(p for p in technique_pages(site) if p.path == "techniques/gradient-checkpointing.md")
    text = render(page)
    assert page.context["examples"][0]["measured"] >= 1
    assert "11.0 → 9.0 GiB" in text
    assert "No case has been measured yet" not in text


def test_estimator_functions_named_by_the_pages_exist_and_are_documented():
    from reportgen.report.methodology import function_doc

    for t in TECHNIQUES:
        for ref in t.functions:
            assert function_doc(ref)["doc"], ref
