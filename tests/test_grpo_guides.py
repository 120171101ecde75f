"""The GRPO guide pages (issue 34, items 3 and 5): ``sweeps/grpo.yaml`` estimated and stored by the pipeline,
one page per (model, GPU) with the answer first, what to turn down first and the largest settings that fit, and
the GRPOConfig that runs each setup. One answer everywhere: the page's verdict and turn-down list are the CLI's
for the config the page prints (read back with ``--from``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reportgen.advise.store import advice_keys, write_advice
from reportgen.cli import main
from reportgen.estimate.verdict import margin_label
from reportgen.report.grpo_guides import INDEX, grpo_guide_pages, guide_path
from reportgen.report.guides import guide_pages
from reportgen.report.mkdocs_hooks import grpo_guides
from reportgen.report.page import SiteData
from reportgen.report.pages import gpu_pages, model_pages
from reportgen.report.render import load_site, render_page
from reportgen.report.rows import site_rows
from reportgen.runner import run_estimates
from reportgen.setup import TrainingSetup
from reportgen.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    results = tmp_path_factory.mktemp("grpo-guides") / "results"
    sweep = load_sweep(ROOT / "sweeps" / "grpo.yaml")
    stats = run_estimates(sweep, results)
    walks = write_advice(sweep, results)
    site = load_site(results, warn=lambda _: None)
    pages = {p.path: render_page(p) for p in grpo_guide_pages(site)}
    return {"sweep": sweep, "stats": stats, "walks": walks, "site": site, "pages": pages,
            "results": {r["id"]: r for r in site.all_results()}}


def test_sweep_stores_grpo_answers(grpo):
    """Every case estimates (what TRL or vLLM would refuse is excluded or set in the sweep file), and its stored
    estimate holds GRPO's own reverse answers, computed at sweep time; SFT's searches and walks do not apply."""
    assert grpo["stats"].failed == 0 and len(grpo["results"]) == len(grpo["sweep"].cases) > 0
    assert advice_keys(grpo["sweep"]) == [] and grpo["walks"].written == 0
    for r in grpo["results"].values():
        est = r["estimate"]
        assert est["max_batch"] is None and est["max_seq"] is None
        assert {"turn_down", "max_num_generations", "max_completion_length", "phases"} <= set(est["grpo"])
        assert (est["grpo"]["turn_down"] == []) == (est["verdict"] == "fits")
    assert not [row for row in site_rows(grpo["site"]) if row["id"] in grpo["results"]]


def _rows(page: str) -> dict[str, str]:
    """The summary table's rows by the case id they link to: the Fits cell's text."""
    out = {}
    for line in page.splitlines():
        m = re.match(r"\| \[[^]]+\]\(#([^)]+)\) \| (.*?) \|", line)
        if m:
            out[m.group(1)] = re.sub(r"<[^>]+>", "", m.group(2)).strip()
    return out


def _config(page: str, case_id: str) -> str:
    """The GRPOConfig YAML printed in the case's section."""
    section = page.split(f"{{ #{case_id} }}", 1)[1]
    return re.search(r"```yaml\n(.*?)\n\s*```", section, re.S).group(1)


def test_page_is_the_cli_answer(grpo, tmp_path, capsys):
    """For a fitting, a tight and a not-fitting setup: the page's verdict, and its turn-down list, are what
    `reportgen estimate --from <the page's GRPOConfig>` prints for the same card."""
    seen = set()
    for r in sorted(grpo["results"].values(), key=lambda r: r["id"]):
        kind = r["estimate"]["verdict"]
        if kind in seen:
            continue
        seen.add(kind)
        model, gpu = r["case"]["model"], r["case"]["gpu"]
        page = grpo["pages"][guide_path(model, gpu)]
        config = tmp_path / f"{r['id']}.yaml"
        config.write_text("\n".join(line.strip() for line in _config(page, r["id"]).splitlines()) + "\n")
        capsys.readouterr()
        assert main(["estimate", "--from", str(config), "--gpu", gpu, "--format", "json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        assert cli["verdict"] == kind
        label = _rows(page)[r["id"]]
        assert label == ("yes" if kind == "fits" else margin_label(kind, cli["capacity"] - cli["demand"]))
        section = page.split(f"{{ #{r['id']} }}", 1)[1].split("\n## ", 1)[0]
        for t in cli["grpo"]["turn_down"]:
            assert f"({t['field']}): **{t['value']}**" in section
        if kind == "fits":
            assert "Nothing to turn down" in section
    assert seen == {"fits", "tight", "does not fit"}


def test_config_reads_back_as_the_case(grpo, tmp_path):
    """Every case's GRPOConfig, read back by `--from`, is the case's own setup (``reverse.grpo_keys``)."""
    from reportgen.configs import setup_from, translate_file
    from reportgen.configs.reverse import grpo_keys

    for r in grpo["results"].values():
        path = tmp_path / "grpo.yaml"
        path.write_text(grpo_keys(r["case"]["model"], r["case"]["setup"]).yaml())
        back, case = setup_from(translate_file(path)), TrainingSetup.model_validate(r["case"]["setup"])
        # kbit_prep: the reader names TRL's (none) where the case leaves the recipe's default, which is none
        assert back.kbit == case.kbit, r["id"]
        assert {**back.model_dump(mode="json"), "kbit_prep": None} == {**r["case"]["setup"], "kbit_prep": None}, r["id"]


def test_links_and_nav(grpo, tmp_path):
    """The guides index, the card's and the model's pages link the GRPO guide; the nav lists the rendered ones."""
    site = grpo["site"]
    index = next(render_page(p) for p in guide_pages(site) if p.path == "guides/index.md")
    assert "(grpo/index.md)" in index
    gpu = next(render_page(p) for p in gpu_pages(site) if p.path == "gpus/l4.md")
    assert "(../guides/grpo/llama-3.2-1b.l4.md)" in gpu
    model = next(render_page(p) for p in model_pages(site) if p.path == "models/qwen3-8b.md")
    assert "(../guides/grpo/qwen3-8b.rtx-4090.md)" in model
    assert "(llama-3.1-8b.l4.md)" in grpo["pages"][INDEX]
    docs = tmp_path / "docs"
    for path in grpo["pages"]:
        (docs / path).parent.mkdir(parents=True, exist_ok=True)
        (docs / path).write_text("x")
    nav = grpo_guides([{"Guides": ["guides/index.md"]}], docs)
    listed = nav[0]["Guides"][1]["GRPO"]
    assert listed[0] == INDEX and sorted(listed) == sorted(grpo["pages"])


def test_user_text_is_escaped(grpo):
    """A stored error (it quotes what the user wrote) reaches the page as text, not markup."""
    r = next(iter(grpo["results"].values()))
    bad = {**r, "id": r["id"] + "x", "status": "error", "estimate": None,
           "error": "SetupError: <script>alert(1)</script> *bold* [link](http://x)"}
    site = SiteData(results={"grpo": [bad]}, reportgen_version="0", git_commit=None)
    page = next(render_page(p) for p in grpo_guide_pages(site) if p.path != INDEX)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "[link](http://x)" not in page
