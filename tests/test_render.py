"""The site's data pages, rendered from fixture result files (the real estimator on the tiny sweeps
of tests/fixtures/sweeps, plus FAKE measurement blocks marked as such)."""

from __future__ import annotations

import csv
import hashlib
import importlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

from reportgen import catalog
from reportgen.cli import main
from reportgen.report import render
from reportgen.report.page import Page
from reportgen.report.rows import TECHNIQUE_COLORS
from reportgen.report.render import case_id_cell
from tests.fixtures.site_data import PUBLISHED, build_results

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OWN = render.DATA_PROVIDERS
TECHNIQUE_SLUGS = ["mixed-precision", "lora", "qlora", "gradient-checkpointing", "gradient-accumulation",
                   "8bit-paged-optimizers", "cpu-offload", "fsdp", "flash-attention", "fused-cross-entropy",
                   "liger-kernels"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("results")
    return d, build_results(d)


@pytest.fixture(scope="module")
def estimates_only(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("results-estimates")
    build_results(d, measured=False)
    return d


@pytest.fixture(scope="module")
def docs(results, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("docs")
    render.render_all(results[0], d, published=PUBLISHED, commit=COMMIT, providers=OWN)
    return d


def tree(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


# ----- pages ------------------------------------------------------------------------------------
def test_the_gpus_index_counts_the_models_each_gpu_page_counts(docs):
    """The index said "T4: 10 of 12" where the T4's page said "7 of 12 swept models fine-tune on one
    card": the index counted a fit at any length and on several cards, the page at 2,048 tokens on one."""
    index = (docs / "gpus" / "index.md").read_text()
    checked = 0
    for key in catalog.gpu_names():
        page = (docs / "gpus" / f"{key}.md").read_text()
        said = re.search(r"\*\*(\d+) of (\d+)\*\* swept models fine-tune on one card", page)
        if said is None:
            continue
        row = next(line for line in index.splitlines() if f"(../gpus/{key}.md)" in line or f"({key}.md)" in line)
        assert f"| {said.group(1)} of {said.group(2)} |" in row, (key, row)
        checked += 1
    assert checked >= 2


def test_a_memory_cell_shows_what_its_verdict_compares(docs):
    """A row showed "21.6" GiB beside "tight (-2.2 GiB)" on a 24 GiB card: the verdict compares what the
    step asks of the card (26.2: the cached blocks it would have to release), which the cell now adds."""
    rows = [line for key in catalog.gpu_names() for line in (docs / "gpus" / f"{key}.md").read_text().splitlines()
            if ">asks " in line]
    assert rows
    for line in rows:
        asks = re.search(r">asks ([0-9.]+)</span>", line).group(1)
        needs = re.search(r'title="(?:tight|no|fits)[^"]*?needs ([0-9.]+) of', line)
        assert needs and needs.group(1) == asks, line[:400]


def test_no_template_runs_a_line_into_the_next_list_item_or_row():
    """trim_blocks eats the newline after a block tag: text ending in ``{% endif %}`` ran the QLoRA
    page's measured sentence into its next bullet ("1.30x).- **But a setup ...")."""
    joined = []
    for path in sorted((ROOT / "reportgen" / "report" / "templates").rglob("*.j2")):
        lines = path.read_text().split("\n")
        for i, (line, after) in enumerate(zip(lines, lines[1:]), 1):
            if (re.search(r"(endif|endfor|else|elif [^%]*|if [^%]*) %\}$", line) and not line.lstrip().startswith("{%")
                    and re.match(r"\s*([-*] |\|)", after)):
                joined.append(f"{path.name}:{i}")
    assert not joined


def test_no_template_line_inside_a_box_starts_with_a_block_tag():
    """lstrip_blocks strips a line's indent before a block tag: "    {% if ... %}text" inside an admonition
    came out at column 0 and ended the box (the techniques' "How reportgen models it" spilled its
    docstrings onto the page)."""
    starts = []
    for path in sorted((ROOT / "reportgen" / "report" / "templates").rglob("*.j2")):
        for i, line in enumerate(path.read_text().split("\n"), 1):
            m = re.match(r"^ {4,}\{%-?\s*(if|for|set)\b.*?%\}(.*)$", line)
            if m and m.group(2).strip():
                starts.append(f"{path.name}:{i}")
    assert not starts


def test_a_setup_label_names_liger_kernels():
    """The guides called a Liger setup "LoRA": its fastest setup, the search's, runs Liger's kernels."""
    from reportgen.report.rows import setup_label
    from reportgen.setup import TrainingSetup

    assert setup_label(TrainingSetup(method="lora", kernels="liger")) == "LoRA, Liger"
    assert setup_label(TrainingSetup(method="lora")) == "LoRA"


def test_a_guide_says_which_recommended_techniques_no_run_has_measured():
    """The guides recommend fused cross-entropy and Liger's kernels, which the harness has not measured:
    the page says so once, with their technique pages, and stops saying it once a measurement covers one."""
    from reportgen.report.guides import unmeasured_in

    setups = [{"loss": "fused", "kernels": "liger"}, {"loss": "standard"}]
    said = unmeasured_in(setups, [{"loss": "standard"}], "guides/t4.md")
    assert [u["link"] for u in said] == ["../techniques/fused-cross-entropy.md", "../techniques/liger-kernels.md"]
    assert [u["label"] for u in unmeasured_in(setups, [{"loss": "fused"}], "guides/t4.md")] == [
        "Liger's layer kernels"]
    assert unmeasured_in([{"loss": "standard"}], [], "guides/t4.md") == []


def test_a_pair_label_names_each_setting_once():
    """Pairs were labelled "nf4 + double quant, double quant" (``setup_label`` already names it)."""
    from reportgen.report.techniques import _label
    from reportgen.setup import TrainingSetup

    label = _label(TrainingSetup(method="qlora", double_quant=True, attn="eager").model_dump(mode="json"))
    assert label.count("double quant") == 1 and label.count("eager attention") == 1, label


def test_every_catalog_gpu_and_model_has_a_page(docs):
    for key in catalog.gpu_names():
        assert (docs / "gpus" / f"{key}.md").is_file(), key
    for name in catalog.model_names():
        assert (docs / "models" / f"{name}.md").is_file(), name
    for page in ("index.md", "gpus/index.md", "models/index.md", "validation.md"):
        assert (docs / page).is_file(), page
    # a GPU and a model no fixture sweep covers say so plainly and send the reader to the Calculator
    l4 = (docs / "gpus" / "l4.md").read_text()
    assert "The L4 is not in the stored sweeps" in l4 and "(../calculator/index.md#gpu=l4)" in l4
    mixtral = (docs / "models" / "mixtral-8x7b.md").read_text()
    assert "mixtral-8x7b is not in the stored sweeps" in mixtral
    assert "(../calculator/index.md#model=mixtral-8x7b)" in mixtral
    assert "not in the stored sweeps" not in (docs / "gpus" / "rtx-4090.md").read_text()


def test_gpu_page_content(docs):
    text = (docs / "gpus" / "rtx-4090.md").read_text()
    assert "## The card" in text and "24.0 GiB" in text and "$0.34 per GPU-hour" in text
    assert "### llama-3.1-8b { #llama-3-1-8b }" in text
    assert '=== "seq 512"' in text and '===+ "seq 2,048"' in text
    for seq in (512, 2048):
        assert (docs / "charts" / "gpus" / f"rtx-4090-memory-s{seq}.svg").is_file()
        assert (docs / "charts" / "gpus" / f"rtx-4090-throughput-s{seq}.svg").is_file()
    assert case_id_cell("llama-3.1-8b.rtx-4090.qlora.0ab15373ec93") in text  # a case id per row
    assert "reportgen sweep sweeps/tiny.yaml" in text and "(../data/gpus/rtx-4090.csv)" in text
    assert COMMIT[:12] in text
    # measured values sit next to their estimate, marked, with their environment linked; the fixture's
    # runs are fake (test fixtures): badged "fake", never with a measurement's "meas." (issue 29)
    assert 'class="rg-fake" title="FAKE: a test fixture' in text and "](../validation.md#env-" in text
    assert '<span class="rg-meas" title="measured on' not in text
    # the failed (OOM) fake measurement is a status, not a number
    assert "OOM <span class=\"rg-fake\"" in text
    # no dollars for a card without a price
    assert "no dated price in the catalog" in (docs / "gpus" / "rtx-3060.md").read_text()


def test_fsdp_setup_is_labelled(docs):
    text = (docs / "gpus" / "h100-sxm.md").read_text()
    assert "Full + ckpt, 8× FSDP" in text


def test_home_grid_and_table(docs):
    text = (docs / "index.md").read_text()
    assert text.startswith("---\nhide:")
    assert "![Grid of 2 models by 3 GPUs" in text
    assert (docs / "charts" / "home-fit-grid.svg").is_file()
    assert "[tinyllama-1.1b](models/tinyllama-1.1b.md)" in text
    assert "](gpus/rtx-4090.md#llama-3-1-8b)" in text
    assert "not swept" in text  # tinyllama is not in the h100 fixture sweep
    assert "(data/sweeps/tiny.csv)" in text and "(data/sweeps/tiny-dc.csv)" in text


def test_model_page(docs):
    text = (docs / "models" / "llama-3.1-8b.md").read_text()
    assert "### Parameters by component" in text and "| **total** | **8,030,261,248** |" in text
    assert (docs / "charts" / "models" / "llama-3.1-8b-memory-by-seq.svg").is_file()
    assert "](../gpus/rtx-4090.md#llama-3-1-8b)" in text
    # fp16 autocast on the T4 and bf16 elsewhere are one line/row on the model page
    assert "fp16-mixed" not in text.split("## Where it fits")[0]


def test_every_image_has_alt_text(docs):
    for page in docs.rglob("*.md"):
        for alt, src in re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", page.read_text()):
            assert len(alt) > 20, (page, src)
            assert (page.parent / src).resolve().is_file(), (page, src)


def test_csv_has_units_and_case_ids(docs, results):
    rows = list(csv.DictReader(io.StringIO((docs / "data" / "gpus" / "rtx-4090.csv").read_text())))
    assert rows and all(r["case_id"] for r in rows)
    assert {"est_peak_allocated_gib", "est_device_total_gib", "est_tokens_per_s", "est_hours_per_100m_tokens",
            "meas_peak_allocated_gib", "environment_id"} <= set(rows[0])
    measured = [r for r in rows if r["meas_peak_allocated_gib"]]
    on_4090 = [i for i in results[1]["measured"] if ".rtx-4090." in i]
    # memory of the H100 run capped to the 4090 counts for the 4090, its speed does not
    assert sorted(r["case_id"] for r in measured) == sorted(on_4090 + results[1]["capped"])
    assert sorted(r["case_id"] for r in rows if r["meas_tokens_per_s"]) == sorted(on_4090)
    # the step time beside tokens/s: the capped run's memory counts, its step time does not
    assert sorted(r["case_id"] for r in rows if r["meas_step_s"]) == sorted(on_4090)
    for r in rows:
        if r["est_step_s"] and r["est_tokens_per_s"]:  # one step's tokens over its seconds
            tokens = int(r["batch"]) * int(r["seq_tokens"]) * int(r["gpus"])
            assert float(r["est_tokens_per_s"]) == pytest.approx(tokens / float(r["est_step_s"]), rel=0.05)
    # the CPU run is no GPU measurement: nothing of it in the GPU's CSV
    cpu = next(r for r in rows if r["case_id"] == results[1]["cpu"][0])
    assert not any(v for k, v in cpu.items() if k.startswith("meas_")) and not cpu["environment_id"]
    sweep_rows = list(csv.DictReader(io.StringIO((docs / "data" / "sweeps" / "tiny.csv").read_text())))
    assert len(sweep_rows) == len(list((results[0] / "tiny").glob("*.json")))
    assert "est_activations_gib" in sweep_rows[0]


def test_hours_and_dollars_are_per_100m_tokens(docs, results):
    # the tiny-dc sweep trains 1e9 tokens: the site scales its hours to 100M
    import json

    path = results[0] / "tiny-dc" / "llama-3.1-8b.h100-sxm.lora.453de8e998c3.json"
    est = json.loads(path.read_text())["estimate"]["time"]
    rows = {r["case_id"]: r for r in csv.DictReader(io.StringIO((docs / "data" / "gpus" / "h100-sxm.csv").read_text()))}
    got = float(rows["llama-3.1-8b.h100-sxm.lora.453de8e998c3"]["est_hours_per_100m_tokens"])
    assert got == pytest.approx(est["train_hours"] / 10, rel=1e-4)


# ----- estimated and measured are told apart ---------------------------------------------------
def test_validation_page_with_fake_measurements(docs, results):
    text = (docs / "validation.md").read_text()
    assert "Fake measurements" in text
    for cid in results[1]["measured"]:
        assert cid in text
    errors, rest = text.split("## Runs that did not finish")
    for cid in results[1]["failed"]:  # an OOM is no measured number: it is a verdict, listed apart
        assert case_id_cell(cid) not in errors and case_id_cell(cid) in rest.split("## Runs that are not GPU measurements")[0]
    assert (docs / "charts" / "validation-scatter.svg").is_file()
    assert "### Error per technique" in text
    assert "| peak allocated | 4 |" in text and "| step time | 3 |" in text  # capped: memory only
    assert "## Measured cases, by environment" in text and "### FAKE NVIDIA" in text  # the fake runs name the card they claim, marked FAKE
    assert "Median absolute error **1.75 GB**" in text  # the fake published comparison
    assert "## Error band" in text and "| reserved | QLoRA |" in text  # reportgen/estimate/error_band.json
    assert (docs / "data" / "validation.csv").is_file()


def test_shipped_state_without_measurements(estimates_only, tmp_path):
    render.render_all(estimates_only, tmp_path, published=tmp_path / "absent.json", commit=COMMIT, providers=OWN)
    text = (tmp_path / "validation.md").read_text()
    assert "No measurements yet" in text and "Fake" not in text
    assert "has not been run" in text and "`reportgen compare-published`" in text
    assert not (tmp_path / "data" / "validation.csv").exists()
    assert not (tmp_path / "charts" / "validation-scatter.svg").exists()
    assert "No case has been measured yet" in (tmp_path / "index.md").read_text()
    csv_text = (tmp_path / "data" / "sweeps" / "tiny.csv").read_text()
    for r in csv.DictReader(io.StringIO(csv_text)):
        assert not r["meas_peak_allocated_gib"] and not r["meas_tokens_per_s"]


def test_no_measured_number_without_a_measurement(estimates_only, tmp_path):
    """Without measurements, a "meas." badge appears only in the legend, never next to a number."""
    render.render_all(estimates_only, tmp_path, published=None, commit=COMMIT, providers=OWN)
    for page in tmp_path.rglob("*.md"):
        for line in page.read_text().splitlines():
            if "rg-meas" in line:
                assert "measured with CUDA on a real GPU" in line or "meas.</span>) sit under" in line, (page, line)


# ----- determinism, stale files, robustness ----------------------------------------------------
def test_render_is_deterministic(results, tmp_path, monkeypatch):
    monkeypatch.setenv("REPORTGEN_CHART_CACHE", "0")  # both renders draw every chart
    a, b = tmp_path / "a", tmp_path / "b"
    render.render_all(results[0], a, published=PUBLISHED, commit=COMMIT)
    render.render_all(results[0], b, published=PUBLISHED, commit=COMMIT)
    ta, tb = tree(a), tree(b)
    assert ta == tb
    assert any(k.endswith(".svg") for k in ta) and any(k.endswith(".csv") for k in ta)
    svg = (a / "charts" / "home-fit-grid.svg").read_text()
    assert "<dc:date>" not in svg


def test_rerender_removes_stale_files_and_keeps_hand_written(results, tmp_path):
    src = tmp_path / "results"
    shutil.copytree(results[0], src)
    docs = tmp_path / "docs"
    (docs / "stylesheets").mkdir(parents=True)
    (docs / "stylesheets" / "site.css").write_text("/* hand-written */\n")
    (docs / "notes.md").write_text("a page someone wrote by hand\n")
    render.render_all(src, docs, published=PUBLISHED, commit=COMMIT, providers=OWN)
    assert (docs / "data" / "sweeps" / "tiny-dc.csv").is_file()
    assert (docs / "charts" / "gpus" / "h100-sxm-memory-s2048.svg").is_file()
    shutil.rmtree(src / "tiny-dc")
    render.render_all(src, docs, published=PUBLISHED, commit=COMMIT, providers=OWN)
    assert not (docs / "data" / "sweeps" / "tiny-dc.csv").exists()
    assert not (docs / "charts" / "gpus" / "h100-sxm-memory-s2048.svg").exists()
    assert not (docs / "data" / "gpus" / "h100-sxm.csv").exists()
    assert (docs / "gpus" / "h100-sxm.md").is_file()  # the nav is static: the page stays, saying so
    assert "is not in the stored sweeps" in (docs / "gpus" / "h100-sxm.md").read_text()
    assert (docs / "stylesheets" / "site.css").read_text() == "/* hand-written */\n"
    assert (docs / "notes.md").is_file()


def test_strict_undefined_catches_missing_keys():
    with pytest.raises(jinja2.UndefinedError):
        render.render_page(Page(path="gpus/x.md", template="gpu.md.j2", context={"root": "../"}))
    env = render.environment()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ row.missing }}").render(row={})


def test_a_missing_provider_is_skipped_with_one_warning(results, tmp_path, capsys):
    specs = OWN + ("reportgen.no_such_module:pages",)
    render.render_all(results[0], tmp_path / "a", published=None, commit=COMMIT, providers=specs)
    render.render_all(results[0], tmp_path / "b", published=None, commit=COMMIT, providers=specs)
    err = capsys.readouterr().err
    assert err.count("reportgen.no_such_module:pages") == 1
    assert (tmp_path / "b" / "index.md").is_file()


def test_providers_cannot_write_hand_written_folders():
    with pytest.raises(ValueError, match="hand-written"):
        render._check_path("stylesheets/x.css", "test")
    with pytest.raises(ValueError):
        render._check_path("../outside.md", "test")


def test_one_colour_per_technique():
    assert list(TECHNIQUE_COLORS) == ["Full", "Full + ckpt", "LoRA", "LoRA + ckpt", "QLoRA", "QLoRA + ckpt"]
    assert len(set(TECHNIQUE_COLORS.values())) == 6


# ----- CLI -------------------------------------------------------------------------------------
def test_cli_render_and_show(results, tmp_path, capsys):
    assert main(["render", "--results", str(results[0]), "--docs", str(tmp_path / "docs")]) == 0
    assert (tmp_path / "docs" / "index.md").is_file()
    cid = results[1]["measured"][1]
    assert main(["show", cid, "--results", str(results[0])]) == 0
    out = capsys.readouterr().out
    assert f"case {cid}" in out and "FAKE" in out and "environment:" in out
    assert "reportgen estimate --model llama-3.1-8b --gpu rtx-4090 --method qlora" in out
    assert "--grad-ckpt" in out and "--format json" in out


def test_show_recomputes_the_stored_estimate(results, capsys):
    import json
    import shlex

    cid = results[1]["measured"][2]
    main(["show", cid, "--results", str(results[0])])
    line = next(ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("reportgen estimate"))
    argv = shlex.split(line)[1:] + ["--format", "json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    stored = json.loads(next(results[0].glob(f"*/{cid}.json")).read_text())["estimate"]
    assert got["memory"] == stored["memory"] and got["max_batch"] == stored["max_batch"]


def test_show_unknown_id_lists_close_ids(results, capsys):
    cid = results[1]["measured"][0]
    typo = cid[:-1] + ("0" if cid[-1] != "0" else "1")  # (a prefix of an id is that id: ``show.resolve_id``)
    assert main(["show", typo, "--results", str(results[0])]) == 2
    err = capsys.readouterr().err
    assert "unknown case id" in err and cid in err


# ----- mkdocs ----------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    pass


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def mkdocs_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def nav_section(nav: list, title: str) -> list[str]:
    for item in nav:
        if isinstance(item, dict) and title in item:
            return [next(iter(x.values())) if isinstance(x, dict) else x for x in item[title]]
    raise AssertionError(f"no {title} in the nav")


def test_mkdocs_nav_lists_the_catalogs():
    cfg = mkdocs_config()
    nav = cfg["nav"]
    gpus = nav_section(nav, "GPUs")
    assert gpus[0] == "gpus/index.md" and sorted(gpus[1:]) == sorted(f"gpus/{g}.md" for g in catalog.gpu_names())
    models = nav_section(nav, "Models")
    assert models[0] == "models/index.md"
    assert sorted(models[1:]) == sorted(f"models/{m}.md" for m in catalog.model_names())
    guides = nav_section(nav, "Guides")
    assert guides == ["guides/index.md"] + [f"guides/{g}.md" for g in catalog.gpu_names()]
    assert nav_section(nav, "Techniques") == ["techniques/index.md"] + [f"techniques/{s}.md" for s in TECHNIQUE_SLUGS]
    assert {"Home": "index.md"} in nav and {"Methodology": "methodology.md"} in nav
    assert {"Validation": "validation.md"} in nav
    assert cfg["plugins"] == ["search"] and cfg["theme"]["name"] == "material"
    assert cfg["docs_dir"] == "docs" and cfg["site_dir"] == "site"
    # mermaid is served from the repository, not a CDN
    for js in cfg["extra_javascript"]:
        assert not js.startswith("http") and (ROOT / "docs" / js).is_file()


#: nav pages of the other providers, by the provider that writes them
OTHER_PAGES = {"reportgen.report.guides:guide_pages": "guides/",
               "reportgen.report.techniques:technique_pages": "techniques/",
               "reportgen.report.methodology:methodology_pages": "methodology.md",
               "reportgen.report.configs:config_pages": "configs.md"}


def missing_providers() -> set[str]:
    out = set()
    for spec in OTHER_PAGES:
        module, _, name = spec.partition(":")
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            out.add(spec)
    return out


def spec_present(prefix: str, absent: set[str]) -> bool:
    """Whether the provider of the nav pages under ``prefix`` is importable (not stubbed)."""
    return not any(p.startswith(prefix) for s, p in OTHER_PAGES.items() if s in absent)


def build_site(results_dir: Path, work: Path, providers=None) -> Path:
    """Render into ``work/docs`` (with the repository's hand-written stylesheets and javascripts),
    build with ``mkdocs build --strict`` into ``work/site``. Nav pages of a provider that is not
    importable (only while another engineer's provider is not there yet) get a stub."""
    docs = work / "docs"
    for sub in ("stylesheets", "javascripts"):
        shutil.copytree(ROOT / "docs" / sub, docs / sub)
    render.render_all(results_dir, docs, published=PUBLISHED, commit=COMMIT, providers=providers)
    absent = missing_providers() if providers is None else set(OTHER_PAGES)
    nav = re.findall(r"(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    for page in nav:
        if not (docs / page).exists():
            if page.startswith("guides/") and page != "guides/index.md" and spec_present("guides/", absent):
                continue  # a card without stored walks has no guide: the mkdocs hook drops its nav entry
            owner = [s for s, prefix in OTHER_PAGES.items() if page.startswith(prefix)]
            assert owner and owner[0] in absent, f"{page} is in the nav but no provider wrote it"
            (docs / page).parent.mkdir(parents=True, exist_ok=True)
            (docs / page).write_text(f"# {page}\n\nStub: provider {owner[0]} is not available.\n")
    cfg = (ROOT / "mkdocs.yml").read_text()
    cfg = re.sub(r"^docs_dir: .*$", f"docs_dir: {docs}", cfg, flags=re.M)
    cfg = re.sub(r"^site_dir: .*$", f"site_dir: {work / 'site'}", cfg, flags=re.M)
    cfg = re.sub(r"^  - (reportgen/\S+\.py)$", lambda m: f"  - {ROOT / m.group(1)}", cfg, flags=re.M)  # hooks
    (work / "mkdocs.yml").write_text(cfg)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(work / "mkdocs.yml")],
                          capture_output=True, text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return work / "site"


def test_mkdocs_build_strict(fixture_site_built):
    site, _ = fixture_site_built  # build_site of the fixture results: the strict build passed, or it errors
    assert (site / "index.html").is_file()
    assert (site / "gpus" / "rtx-4090" / "index.html").is_file()
    assert (site / "validation" / "index.html").is_file()
    assert (site / "data" / "sweeps" / "tiny.csv").is_file()
    html = (site / "gpus" / "rtx-4090" / "index.html").read_text()
    assert "../../charts/gpus/rtx-4090-memory-s2048.svg" in html
    assert "unpkg.com" not in html


def test_pages_workflow_tests_before_it_deploys():
    """The site is published only from a main whose test suite passed, with the CPU torch pinned
    first (as the README's test command does) so CI does not pull CUDA wheels."""
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "pages.yml").read_text())
    jobs = wf["jobs"]
    assert jobs["build"]["needs"] == "test" and jobs["deploy"]["needs"] == "build"
    test_steps = " ".join(str(s.get("run", "")) for s in jobs["test"]["steps"])
    assert "python -m pytest" in test_steps
    assert test_steps.index("torch==2.13.0") < test_steps.index('-e ".[site,measure,dev]"')
    assert '-c constraints.txt -e ".[site,measure,dev]"' in test_steps  # the stack the suite passes with (issue 35)
    build = " ".join(str(s.get("run", "")) for s in jobs["build"]["steps"])
    assert "mkdocs build --strict" in build and "reportgen render" in build


def test_the_404_page_is_styled_under_the_published_sub_path(fixture_site_built, tmp_path):
    """Issue 31: GitHub Pages serves 404.html at any missing path under /reportgen/; the workflow gives
    mkdocs the published address (configure-pages' base_url) before the build, and with it Material's
    404 page links its stylesheets under the sub-path, where they are (without it: from the domain's
    root, where they are not)."""
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "pages.yml").read_text())
    steps = wf["jobs"]["build"]["steps"]
    pages = next(i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("actions/configure-pages@"))
    build = next(i for i, s in enumerate(steps) if "mkdocs build --strict" in str(s.get("run", "")))
    run = steps[build]["run"]
    assert pages < build and steps[pages]["id"] == "pages"
    assert run.index('echo "site_url: ${{ steps.pages.outputs.base_url }}/" >> mkdocs.yml') < run.index("mkdocs build")
    site, _ = fixture_site_built
    cfg = (site.parent / "mkdocs.yml").read_text()
    cfg = re.sub(r"^site_dir: .*$", f"site_dir: {tmp_path / 'site'}", cfg, flags=re.M)
    (tmp_path / "mkdocs.yml").write_text(cfg + "site_url: https://example.github.io/reportgen/\n")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
                          capture_output=True, text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    links = re.findall(r'<link[^>]+href="([^"]+\.css)"', (tmp_path / "site" / "404.html").read_text())
    assert links and all(h.startswith("/reportgen/") for h in links), links
    assert all(not h.startswith("/reportgen/") for h in re.findall(r'<link[^>]+href="([^"]+\.css)"',
                                                                   (site / "404.html").read_text()))


def test_ci_runs_the_readme_test_command_with_loud_skips():
    """.ci/run is the README's test command verbatim, and both run pytest with REPORTGEN_REQUIRE_ALL=1,
    so CI fails when a must-run module (trace agreement, browser, calculator) skipped, as the Pages
    workflow does."""
    readme = (ROOT / "README.md").read_text()
    command = [ln for ln in readme.splitlines() if ln.startswith("apt-get update") and "pytest" in ln]
    assert len(command) == 1
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in ln]
    assert ci == command
    runs = command[0].split("&&")
    pytests = [r.strip() for r in runs if "pytest" in r]
    assert len(pytests) == 2 and all(r.startswith("REPORTGEN_REQUIRE_ALL=1 python -m pytest") for r in pytests)
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "pages.yml").read_text())
    assert any(step.get("env", {}).get("REPORTGEN_REQUIRE_ALL") == "1" for step in wf["jobs"]["test"]["steps"])
    # the timing run names the modules that hold timing tests (collecting the rest took 15-20 s): a timing
    # test written anywhere else would never run, in CI or the Pages workflow
    timed = sorted(p.name for p in (ROOT / "tests").glob("test_*.py")
                   if re.search(r"^\s*@pytest\.mark\.timing|pytestmark\s*=.*timing", p.read_text(), re.M))
    assert timed == ["test_calculator_browser.py"]
    for run in (pytests[1], *(str(step.get("run", "")) for step in wf["jobs"]["test"]["steps"])):
        if "-m timing" in run:
            assert run.split("-m timing", 1)[1].split("&&")[0].split() == [f"tests/{name}" for name in timed], run


def test_setup_labels_tell_every_recipe_field_apart():
    """The site's setup label names each choice that changes the numbers, so two rows of one table
    never read the same (the validation sweep has dropout pairs; issue 9's recipe fields)."""
    from reportgen.report.rows import setup_label
    from reportgen.setup import TrainingSetup

    variants = [dict(method="lora"), dict(method="lora", lora_dropout=0.05), dict(method="lora", dora=True),
                dict(method="lora", frozen_dtype="fp32"), dict(method="qlora"), dict(method="qlora", quant_head=True),
                dict(method="qlora", kbit_prep="trl"), dict(method="qlora", kbit_prep="none")]
    labels = [setup_label(TrainingSetup(**kw)) for kw in variants]
    assert len(set(labels)) == len(labels), labels


def test_the_home_and_methodology_pages_count_the_same_measured_cases(results):
    """Issue 31: '52 of 2,641 cases have a measurement that counts' beside '51 cases also have a
    measurement': the home page left out the case whose measurement is an OOM verdict."""
    from reportgen.report.methodology import methodology_pages
    from reportgen.report.pages import home_pages, site_rows

    site = render.load_site(results[0], warn=lambda m: None)
    n_home = home_pages(site)[0].context["n_measured"]
    assert n_home == methodology_pages(site)[0].context["n_compared"] > 0
    # the fixture has such a case, so the test tells the two counts apart
    assert any(r["compare"] and not r["measured"] for r in site_rows(site))


def test_no_sentence_runs_into_the_next(docs):
    """Issue 31: 'traced case.Measured' on the GPU pages (a template's line break eaten by trim_blocks).
    Outside code spans, links and URLs, a word, a full stop and a capitalised word with no space
    between them is such a join (``torch.optim.AdamW`` is a path: what precedes it is a dot)."""
    joined = {}
    for page in sorted(docs.rglob("*.md")):
        text = re.sub(r"`+[^`]*`+", "", page.read_text())
        text = re.sub(r"\]\([^)]*\)|https?://\S+", "]", text)
        for m in re.finditer(r"(?<![\w.])[a-z]{3,}\.[A-Z][a-z]{2,}", text):
            joined.setdefault(page.relative_to(docs).as_posix(), []).append(m.group())
    assert joined == {}


def test_a_render_with_nothing_changed_writes_nothing_and_says_so(results, tmp_path, capsys):
    """Issue 31: a second run with nothing changed re-rendered every page. Now the key of every
    input (result files, code, data, commit) is kept in the manifest: the same key and every file
    in place is no render; a changed result file, or a page deleted, renders again."""
    import os
    import time

    docs = tmp_path / "docs"
    first = render.render_all(results[0], docs, published=PUBLISHED, commit=COMMIT, providers=OWN)
    assert not first.unchanged and first
    page = docs / "index.md"
    mtime = page.stat().st_mtime_ns
    t0 = time.perf_counter()
    again = render.render_all(results[0], docs, published=PUBLISHED, commit=COMMIT, providers=OWN)
    assert again.unchanged and sorted(again) == sorted(first) and page.stat().st_mtime_ns == mtime
    assert time.perf_counter() - t0 < 1.0
    assert "site unchanged" in again.said(docs)
    result = next(results[0].rglob("*.json"))
    os.utime(result, ns=(result.stat().st_atime_ns, result.stat().st_mtime_ns + 10**9))
    assert not render.render_all(results[0], docs, published=PUBLISHED, commit=COMMIT, providers=OWN).unchanged
    page.unlink()
    assert not render.render_all(results[0], docs, published=PUBLISHED, commit=COMMIT, providers=OWN).unchanged
    assert page.is_file()
    assert not render.render_all(results[0], docs, published=PUBLISHED, commit="another", providers=OWN).unchanged


def test_no_page_prints_none_for_a_missing_figure(docs):
    """Issue 31: the A10G page said 'Host link None' (its catalog entry has no published host link)."""
    found = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")
             if re.search(r"\|\s*None\s*(\||\()|\bNone\b \(", p.read_text())}
    assert found == set()
    assert "| Host link | not published |" in (docs / "gpus" / "a10g.md").read_text()


def test_a_gpu_page_opens_with_its_answer(docs):
    """Issue 31: the answer first. The box under the title says how many swept models fine-tune on
    one card, the largest with its fastest setup (the 'Fastest setup per model' row of that model),
    and how many fit a full fine-tune."""
    text = (docs / "gpus" / "rtx-4090.md").read_text()
    head = text.split("## The card")[0]
    box = re.search(r'!!! abstract "On one RTX 4090 \(24\.0 GiB\)"\n((?:    .*\n)+)', head)
    assert box, head[:600]
    body = " ".join(box.group(1).split())
    fitting, models = map(int, re.search(r"\*\*(\d+) of (\d+)\*\* swept models", body).groups())
    assert 0 < fitting <= models
    largest = re.search(r"the largest of them, \[([^\]]+)\]", body).group(1)
    row = next(line for line in text.split("## Fastest setup per model")[1].splitlines()
               if line.startswith(f"| [{largest}]"))
    tokens = re.search(r"about ([0-9,]+) tokens/s", body).group(1)
    assert tokens in row
    assert re.search(r"Full fine-tuning fits \d+ of them on one card", body)


def test_a_model_page_opens_with_its_answer(docs):
    """Issue 31: the answer first, inside one box above the legend: the smallest card the model
    fine-tunes on alone, with the setup its 'Where it fits' row names, and where full fine-tuning fits."""
    text = (docs / "models" / "llama-3.1-8b.md").read_text()
    head = text.split("## Architecture")[0]
    box = re.search(r'!!! abstract "Where llama-3.1-8b fine-tunes"\n((?:    .*\n)+)', head)
    assert box, head[:800]
    body = " ".join(box.group(1).split())
    card = re.search(r"\*\*On one (.+?)\*\*", body).group(1)
    tokens = re.search(r"about ([0-9,]+) tokens/s", body).group(1)
    row = next(line for line in text.split("## Where it fits")[1].splitlines() if line.startswith(f"| [{card}]"))
    assert tokens in row
    assert "Full fine-tuning fits" in body and "every card is [below](#where-it-fits)" in body


def test_a_note_naming_keys_reads_as_itself():
    """Notes name config keys such as model._component_: Markdown must not set them in italics (seen on the
    guides' torchtune configs), and markup characters stay text."""
    from markdown import markdown

    html = markdown(str(render._note("name yours under model._component_ | *not bold*")))
    assert "<em>" not in html and "model._component_" in html.replace("&#95;", "_")
    assert "*not bold*" in html.replace("&#42;", "*")


def test_gpu_pages_say_the_l2_and_where_the_time_rates_come_from(docs):
    """Issue 30: a card's page shows its L2 cache and whose rates its step times use, in the estimate's words."""
    r5090 = (docs / "gpus" / "rtx-5090.md").read_text()
    assert "| L2 cache | 96 MB (NVIDIA RTX Blackwell GPU architecture whitepaper" in r5090
    # the apostrophes reach the page as HTML entities, which the browser shows as written
    assert "estimated from Ada GeForce&#39;s" in r5090 and "no step time of a Blackwell GeForce card" in r5090
    assert "the GeForce cards&#39; pooled fit to 27 published runs" in (docs / "gpus" / "rtx-4090.md").read_text()
    assert "every rate fitted to our own step times on this card" in (docs / "gpus" / "h100-sxm.md").read_text()
