"""The decision tree as data, its walk, `reportgen advise`, the stored walks and the guide pages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from reportgen import catalog
from reportgen.advise import tree as T
from reportgen.report.guides import guide_pages
from reportgen.advise.store import ADVICE_DIR, advice_keys, load_advice, write_advice
from reportgen.advise.walk import PREDICATES, walk
from reportgen.cli import main
from reportgen.estimate import estimate
from reportgen.report.page import SiteData
from reportgen.store import load_results as iter_results
from reportgen.runner import run_estimates
from reportgen.setup import TrainingSetup
from reportgen.sweep import load_sweep

FIXTURE_SWEEP = """\
name: fixture
grids:
  - model: [llama-3.2-1b, llama-3.1-8b]
    gpu: [rtx-4090, h100-sxm]
    method: [full, lora, qlora]
    grad_ckpt: [false, true]
    seq: 2048
"""


# ----- shared fixtures (imported by test_techniques and test_methodology) ---------------------------
@dataclass(frozen=True)
class _SiteWithAdvice(SiteData):
    advice: dict = field(default_factory=dict)


def make_site(results: dict, advice: dict | None = None) -> SiteData:
    """SiteData carrying stored walks, whether or not ``SiteData`` has the ``advice`` field yet."""
    try:
        return SiteData(results=results, reportgen_version="test", git_commit=None, advice=advice or {})
    except TypeError:
        return _SiteWithAdvice(results=results, reportgen_version="test", git_commit=None, advice=advice or {})


def build_fixture(tmp_path) -> tuple[SiteData, object]:
    """Run the fixture sweep's estimates and walks in ``tmp_path``; the site that reads them back."""
    path = tmp_path / "fixture.yaml"
    path.write_text(FIXTURE_SWEEP)
    sweep = load_sweep(path)
    results_dir = tmp_path / "results"
    run_estimates(sweep, results_dir)
    write_advice(sweep, results_dir)
    results = {sweep.name: iter_results(results_dir / sweep.name)}
    return make_site(results, load_advice(results_dir)), sweep


def render(page) -> str:
    from reportgen.report.render import render_page

    return render_page(page)


@pytest.fixture(scope="module")
def fixture_site(tmp_path_factory):
    return build_fixture(tmp_path_factory.mktemp("advise"))


# ----- the tree as data ----------------------------------------------------------------------------
def test_node_ids_unique_and_edges_point_to_nodes():
    ids = [n.id for n in T.NODES]
    assert len(ids) == len(set(ids))
    for n in T.NODES:
        for target in T.successors(n):
            assert target in T.BY_ID, f"{n.id} -> {target}"
    for n in T.NODES:
        if isinstance(n, T.End):
            assert set(n.options) <= set(T.OPTION_BY_ID)
        if isinstance(n, T.Check):
            # "host": the compute-bound check's third answer, a step that waits on the host's kernel launches
            assert set(n.edges) <= {"yes", "no", "host", "unknown"} and {"yes", "no"} <= set(n.edges)
            assert n.test in PREDICATES
            assert n.variant in ("as-is", "min-activations")


def test_every_node_reachable_and_the_tree_has_no_cycle():
    seen, order = set(), []

    def visit(node_id, stack):
        assert node_id not in stack, f"cycle through {node_id}"
        if node_id in seen:
            return
        seen.add(node_id)
        for nxt in T.successors(T.BY_ID[node_id]):
            visit(nxt, stack | {node_id})
        order.append(node_id)

    visit(T.ROOT, frozenset())
    assert seen == set(T.BY_ID)


def _resolve_sample(change: dict) -> dict:
    sample = {"@default-precision": "bf16-mixed", "@max-batch": 4, "@accum-to-target": 4, "@max-seq": 1024,
              "@gpus": 4}
    for value in change.values():
        if isinstance(value, str) and value.startswith("@"):
            assert value in T.SYMBOLS, value
    return {k: sample.get(v, v) if isinstance(v, str) else v for k, v in change.items()}


@pytest.mark.parametrize("item", [n for n in T.NODES if isinstance(n, T.Action)] + list(T.OPTIONS),
                         ids=lambda n: n.id)
def test_every_action_is_a_real_setup_change(item):
    """Applied to the walk's baseline (the defaults for the baseline itself), every action and option
    gives a valid TrainingSetup that differs from it."""
    assert set(item.change) <= set(TrainingSetup.model_fields)
    baseline = TrainingSetup(**{**TrainingSetup().model_dump(), **T.BY_ID[T.ROOT].change})
    before = TrainingSetup() if item.id == T.ROOT else baseline
    after = TrainingSetup(**{**before.model_dump(), **_resolve_sample(item.change)})
    assert after != before, f"{item.id} changes nothing"


def test_technique_links_exist():
    from reportgen.report.techniques import BY_SLUG

    for item in list(T.NODES) + list(T.OPTIONS):
        slug = getattr(item, "technique", None)
        assert slug is None or slug in BY_SLUG, (item.id, slug)


def test_mermaid_is_a_flowchart_with_unique_defined_ids():
    text = T.mermaid(highlight=["start", "lora"])
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    defined = re.findall(r"^\s+([A-Za-z_][\w]*)(?:\[|\{|\(\[)", text, flags=re.M)
    subgraphs = re.findall(r"^\s+subgraph (\w+)\[", text, flags=re.M)
    defined = [d for d in defined if d not in subgraphs]
    assert len(defined) == len(set(defined)) == len(T.NODES) + len(T.OPTIONS)
    reserved = {"end", "graph", "subgraph", "flowchart", "class", "classDef", "style", "click"}
    assert not set(defined) & reserved and not set(subgraphs) & set(defined)
    edges = re.findall(r"^\s+(\w+) (?:--> |-- \w+ --> |-\.-> )(\w+)$", text, flags=re.M)
    assert len(edges) >= len(T.NODES) - 1
    for a, b in edges:
        assert a in defined and b in defined
    assert text.count("subgraph") == text.count("\n    end")
    assert '"' not in "".join(re.findall(r'"([^"]*)"', text))  # labels carry no raw quotes


def test_tree_hash_follows_the_trees_data(monkeypatch):
    """Stored walks are redone when the tree's data changes, and only then: the hash is the same in
    another interpreter (another string-hash seed) and changes with a constant of the tree."""
    from reportgen.advise.store import advice_inputs_hash

    before, stored = T.tree_hash(), advice_inputs_hash("llama-3.2-1b", "t4", 2048, 10**8)
    assert re.fullmatch(r"[0-9a-f]{12}", before)
    other = subprocess.run([sys.executable, "-c", "from reportgen.advise import tree; print(tree.tree_hash())"],
                           capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == before
    monkeypatch.setattr(T, "TARGET_EFFECTIVE_BATCH", T.TARGET_EFFECTIVE_BATCH * 2)
    assert T.tree_hash() != before and advice_inputs_hash("llama-3.2-1b", "t4", 2048, 10**8) != stored


# ----- the walk -------------------------------------------------------------------------------------
def test_70b_on_a_4090_does_not_fit_on_one_card_and_offers_offload_and_more_gpus():
    w = walk("llama-3.1-70b", "rtx-4090", 2048)
    assert w["verdict"]["kind"] == "beyond-one-card"
    assert w["recommended"] is None
    assert "does not fit on one" in w["verdict"]["summary"]
    options = {o["id"]: o for o in w["options"]}
    assert {"offload-params", "offload-optimizer", "fsdp-lora", "fsdp-qlora"} <= set(options)
    assert options["offload-params"]["fits"]
    assert options["fsdp-qlora"]["fits"] and options["fsdp-qlora"]["gpus"] in T.FSDP_GPU_COUNTS
    assert options["fsdp-qlora"]["numbers"]["setup"]["sharding"] == "fsdp"
    # every single-card step-1 technique was tried, in the tree's order
    assert w["turned_on"] == ["lora", "qlora", "double_quant", "paged_8bit"]
    assert w["search"]["same"]  # cheapest_setup finds nothing either


def test_1b_on_an_h100_needs_nothing_beyond_the_defaults():
    w = walk("llama-3.2-1b", "h100-sxm", 2048)
    assert w["verdict"]["kind"] == "fits"
    assert w["turned_on"] == []
    rec = w["recommended"]["setup"]
    assert rec["method"] == "full" and rec["precision"] == "bf16-mixed" and rec["attn"] == "sdpa"
    assert not rec["grad_ckpt"] and rec["loss"] == "standard"


def test_8b_on_a_4090_ends_with_a_fitting_setup_whose_numbers_match_estimate():
    w = walk("llama-3.1-8b", "rtx-4090", 2048)
    assert w["verdict"]["kind"] == "fits"
    rec = w["recommended"]
    setup = TrainingSetup(**rec["setup"])
    assert setup.seq == 2048 and setup.method.value in ("lora", "qlora")
    est = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_gpu("rtx-4090"), setup)
    assert est.fits and rec["fits"]
    assert rec["device_total"] == est.memory.device_total
    assert rec["tokens_per_s"] == est.time.tokens_per_s
    assert rec["max_batch"] == est.max_batch
    assert setup.batch * setup.accum >= T.TARGET_EFFECTIVE_BATCH
    # Step 1 found full fine-tuning too big, Step 2 needed more than batch 1 as is
    checks = {s["node"]: s for s in w["steps"] if s["kind"] == "check"}
    assert checks["fit_params_full"]["outcome"] == "no" and checks["fit_b1"]["outcome"] == "no"
    assert "lora" in w["turned_on"]


def test_walk_steps_carry_consistent_numbers():
    w = walk("llama-3.1-8b", "rtx-4090", 2048)
    cap = catalog.load_gpu("rtx-4090").memory_bytes
    for s in w["steps"]:
        n = s.get("numbers")
        if n is None:
            continue
        assert n["capacity"] == cap
        assert n["fits"] == (n["free"] >= 0)
        if s["kind"] == "check" and s["variant"] == "min-activations":
            assert n["setup"]["grad_ckpt"] and n["setup"]["loss"] == "fused" and n["setup"]["batch"] == 1
    assert w["path"][0] == T.ROOT and w["path"][-1] == w["verdict"]["node"]
    json.dumps(w)  # plain data


def test_gemma2_walk_says_it_runs_eager_attention():
    w = walk("gemma-2-9b", "h100-sxm", 2048)
    notes = [note for s in w["steps"] for note in (s.get("numbers") or {}).get("notes", [])]
    assert any("soft-capping" in note for note in notes)


# ----- the CLI ----------------------------------------------------------------------------------------
def test_advise_json_is_the_walk(capsys):
    """``advise --format json`` prints the walk itself: the same steps, verdict and recommended setup
    with the numbers ``reportgen estimate`` gives that setup."""
    assert main(["advise", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--seq", "2048", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # beside the walk, the host whose dispatch its tokens/s assume (the card's default desktop: dispatch.py)
    assert d.pop("host_dispatch")["cpu"] == "amd-ryzen-5-7600x"
    assert d.pop("host_dispatch_note").startswith("host dispatch: AMD Ryzen 5 7600X (default desktop)")
    fresh = json.loads(json.dumps(walk("llama-3.1-8b", "rtx-4090", 2048)))
    assert d == fresh
    assert d["verdict"]["kind"] == "fits" and d["tree_hash"] == T.tree_hash()
    rec = d["recommended"]
    est = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_gpu("rtx-4090"), TrainingSetup(**rec["setup"]))
    assert (rec["device_total"], rec["tokens_per_s"], rec["max_batch"], rec["fits"]) == (
        est.memory.device_total, est.time.tokens_per_s, est.max_batch, True)


def test_advise_table_prints_the_walk_and_verdict(capsys):
    """Every evaluated step's row shows that step's device total (GiB of 2^30 bytes, one decimal) and
    tokens/s, in the walk's order; the verdict is the walk's."""
    assert main(["advise", "--model", "llama-3.1-70b", "--gpu", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    w = walk("llama-3.1-70b", "rtx-4090", 2048)
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if re.match(r"│ +\d+ │", line)]
    shown = [(r[3], r[4]) for r in rows if r[3] not in ("", "-")]
    expected = [(f"{n['device_total'] / 2**30:.1f}", f"{n['tokens_per_s']:,.0f}")
                for s in w["steps"] if (n := s.get("numbers"))]
    assert shown == expected and len(shown) >= 6
    assert w["verdict"]["title"] in out and "does not fit on one" in w["verdict"]["summary"]
    assert "option" in out and "compared with a search" in out
    assert "cheapest_setup" not in out and "estimate.search" not in out  # no internal names in the answer


def test_advise_mermaid(capsys):
    assert main(["advise", "--mermaid"]) == 0
    assert capsys.readouterr().out.startswith("flowchart TD")


@pytest.mark.parametrize("args,needle", [
    ([], "--model and --gpu"),
    (["--model", "llama-9", "--gpu", "t4"], "unknown model"),
    (["--model", "llama-3.2-1b", "--gpu", "t4", "--seq", "4"], "--seq"),
])
def test_advise_bad_input_exits_2(capsys, args, needle):
    try:  # in-process: an exception would fail the test
        code = main(["advise", *args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert code == 2, err
    assert needle in err and "Traceback" not in err


# ----- stored walks -------------------------------------------------------------------------------------
def test_walks_are_stored_next_to_the_results_and_skipped_when_unchanged(tmp_path):
    site, sweep = build_fixture(tmp_path)
    results_dir = tmp_path / "results"
    files = sorted((results_dir / sweep.name / ADVICE_DIR).glob("*.json"))
    assert len(files) == len(advice_keys(sweep)) == 4
    assert len(iter_results(results_dir / sweep.name)) == len(sweep.cases)  # not taken for cases
    stats = write_advice(sweep, results_dir)
    assert stats.written == 0 and stats.skipped == 4
    doc = json.loads(files[0].read_text())
    assert doc["sweep"] == "fixture" and doc["inputs_hash"] and doc["tree_hash"] == T.tree_hash()
    assert load_advice(results_dir)["fixture"][0]["model"] == doc["model"]
    # a smaller sweep removes the walks it no longer covers
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(FIXTURE_SWEEP.replace("[llama-3.2-1b, llama-3.1-8b]", "llama-3.2-1b"))
    stats = write_advice(load_sweep(smaller), results_dir)
    assert stats.removed == 2 and len(list((results_dir / sweep.name / ADVICE_DIR).glob("*.json"))) == 2


def test_stored_walk_equals_a_fresh_walk(fixture_site):
    site, _ = fixture_site
    doc = site.advice["fixture"][0]
    fresh = walk(doc["model"], doc["gpu"], doc["seq"], train_tokens=doc["train_tokens"])
    assert {k: doc[k] for k in fresh} == fresh


# ----- the guide pages ------------------------------------------------------------------------------------
def test_guide_pages_for_every_card_with_stored_walks(fixture_site):
    site, _ = fixture_site
    pages = guide_pages(site)
    paths = [p.path for p in pages]
    assert paths[0] == "guides/index.md"
    assert sorted(paths[1:]) == ["guides/h100-sxm.md", "guides/rtx-4090.md"]  # the fixture sweep's cards
    texts = {p.path: render(p) for p in pages}
    for path, text in texts.items():
        assert "```mermaid\nflowchart TD" in text, path
        assert "no sweep covers" not in text.lower(), path
    g = texts["guides/rtx-4090.md"]
    assert "### llama-3.1-8b" in g and "Fits on one card" in g and "est." in g
    assert "reportgen advise --model llama-3.1-8b --gpu rtx-4090 --seq 2048" in g
    assert "## Other models" in g and "reportgen advise --model llama-3.1-70b --gpu rtx-4090" in g
    assert "](../calculator/index.md#gpu=rtx-4090)" in g
    index = texts["guides/index.md"]
    assert "What each step turns on" in index and "[RTX 4090](rtx-4090.md)" in index
    # a card without walks has no guide: the index sends it to the Calculator and the advise command
    assert "(a10g.md)" not in index
    assert "[Calculator](../calculator/index.md#gpu=a10g)" in index
    assert "`reportgen advise --model llama-3.1-8b --gpu a10g`" in index


def test_without_stored_walks_only_the_index_is_written():
    pages = guide_pages(SiteData(results={}, reportgen_version="test", git_commit=None))
    assert [p.path for p in pages] == ["guides/index.md"]
    text = render(pages[0])
    assert "No walk is stored yet" in text and "no sweep covers" not in text.lower()


def test_guide_shows_measurements_next_to_estimates(fixture_site):
    site, _ = fixture_site
    doc = next(d for d in site.advice["fixture"] if d["model"] == "llama-3.1-8b" and d["gpu"] == "rtx-4090")
    target = doc["recommended"]["case_id"]
    measured = {"id": target, "case": {"model": doc["model"], "gpu": doc["gpu"], "setup": doc["recommended"]["setup"]},
                "status": "ok", "estimate": None, "sweep": "measured",
                "measurement": {"status": "ok", "device_total": 23 * 2**30, "tokens_per_s": 1500.0, "fake": True,
                                "environment": {"device": "cuda", "gpu_catalog_key": "rtx-4090"}}}
    site2 = make_site({**site.results, "measured": [measured]}, site.advice)
    page = next(p for p in guide_pages(site2) if p.path == "guides/rtx-4090.md")
    text = render(page)
    assert "Measured" in text and "23.0 GiB" in text


def test_no_two_stages_share_a_label():
    """Issue 19: "Step 2" labelled both the activations of micro-batch 1 and raising the batch."""
    labels = [label.split(":")[0] for label in T.STAGES.values()]
    assert len(labels) == len(set(labels)), labels
