"""Property-based tests (Hypothesis) of bad input, issue 20: whatever flags, sweep file or config.json
a user gives, a command exits 0 or 2 (1 only where the CLI documents it: a sweep with failed
estimates), never prints a traceback, writes nothing outside ``results/`` and the docs folder, and
no page built from the input holds markup from it.

Examples are derandomized (the same ones on every run, so CI is reproducible) and few: the whole file
runs in about 30 s on two cores. Commands run in process (``reportgen.cli.main``)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import string
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reportgen import catalog
from reportgen.cli import main
from reportgen.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]
CONFIG = json.loads((ROOT / "reportgen" / "catalog" / "models" / "llama-3.2-1b.json").read_text())


def examples(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def run(argv: list[str], cwd: Path) -> tuple[int, str]:
    """``reportgen ARGV`` in process, in ``cwd``: its exit status and everything it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse refuses a flag or a choice itself, with status 2
            code = exc.code
    return code, out.getvalue() + err.getvalue()


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def assert_clean(code, text: str, allowed=(0, 2)) -> None:
    event(f"exit {code}")  # pytest --hypothesis-show-statistics: how many examples got how far
    assert code in allowed, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("properties")


# ----- flags --------------------------------------------------------------------------------------
NASTY = st.text(alphabet=string.printable + "äé€<>\x7f", max_size=12)


def _flag_value(name: str):
    spec = TrainingSetup.model_fields[name]
    t = spec.annotation
    if t is bool:
        return st.just(None)
    if isinstance(t, type) and hasattr(t, "__members__"):
        good = [m.value for m in t]  # type: ignore[attr-defined]
        return st.one_of(st.sampled_from(good), NASTY)
    numbers = st.one_of(st.integers(-5, 10**7), st.integers(), st.floats(allow_nan=True, allow_infinity=True))
    if t is str:
        return st.one_of(st.sampled_from(["qv", "attn", "all-linear", "q,v,lm_head", "q_proj,bogus"]), NASTY)
    return st.one_of(numbers.map(str), NASTY)


#: values every field takes (a valid command line is drawn about half the time)
GOOD_FLAGS = {"precision": ["bf16-mixed", "fp16-mixed", "fp32", "bf16"], "optimizer": ["adamw", "adamw-8bit", "sgd"],
              "batch": ["1", "2", "8"], "seq": ["128", "2048", "8192"], "accum": ["1", "4"], "grad_ckpt": [None],
              "attn": ["sdpa", "eager"], "loss": ["standard", "fused", "chunked"], "padding": ["max", "packed"],
              "offload": ["none", "optimizer"], "compile": [None]}
GOOD_PEFT = {"lora_rank": ["8", "64"], "lora_targets": ["qv", "all-linear", "q,v,lm_head"], "lora_dropout": ["0.1"],
             "dora": [None]}


@st.composite
def flag_lists(draw) -> list[str]:
    clean = draw(st.booleans())
    models = st.sampled_from(["llama-3.2-1b", "tinyllama-1.1b", "gemma-3-1b"])
    gpus = st.sampled_from(["rtx-4090", "t4", "h100-sxm"])
    if not clean:
        models = st.one_of(models, st.sampled_from(["llama-9b", "", "nope.json", "."]), NASTY)
        gpus = st.one_of(gpus, NASTY)
    argv = ["--model", draw(models), "--gpu", draw(gpus)]
    if clean:
        method = draw(st.sampled_from(["full", "lora", "qlora"]))
        pool = {**GOOD_FLAGS, **(GOOD_PEFT if method != "full" else {})}
        argv += ["--method", method]
        for name in draw(st.lists(st.sampled_from(sorted(pool)), max_size=4, unique=True)):
            value = draw(st.sampled_from(pool[name]))
            argv += ["--" + name.replace("_", "-")] + ([] if value is None else [value])
        if draw(st.booleans()):
            argv += ["--gpu-memory", draw(st.sampled_from(["48GiB", "24 GB", "8000MiB"]))]
        return argv
    for name in draw(st.lists(st.sampled_from(list(TrainingSetup.model_fields)), max_size=5, unique=True)):
        flag = "--" + name.replace("_", "-")
        value = draw(_flag_value(name))
        argv += [flag] if value is None else [flag, value]
    if draw(st.booleans()):
        argv += ["--gpu-memory", draw(st.one_of(st.sampled_from(["48GiB", "0GiB", "1e9TiB", "24 GB"]), NASTY))]
    if draw(st.booleans()):
        argv += ["--train-tokens", draw(st.one_of(st.sampled_from(["1e8", "nan", "-1", "1e400"]), NASTY))]
    return argv


@examples(60)
@given(argv=flag_lists(), command=st.sampled_from(["estimate", "estimate", "advise"]))
def test_any_flags_exit_0_or_2_and_write_nothing(work, argv, command):
    cwd = work / "flags"
    cwd.mkdir(exist_ok=True)
    if command == "advise":  # advise has no setup flags: keep the model, card and memory
        keep = {"--model", "--gpu", "--gpu-memory", "--train-tokens"}
        argv = [x for i, x in enumerate(argv) if x in keep or (i and argv[i - 1] in keep)]
    code, text = run([command, *argv], cwd)
    assert_clean(code, text)
    assert files_under(cwd) == set()


# ----- config.json --------------------------------------------------------------------------------
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.integers(-3, 300),
                              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                    max_leaves=8)
KEYS = sorted(set(CONFIG) | {"num_local_experts", "num_experts_per_tok", "num_experts", "moe_intermediate_size",
                             "head_dim", "sliding_window", "sliding_window_pattern", "layer_types",
                             "partial_rotary_factor", "rope_parameters", "resid_pdrop", "decoder_sparse_step",
                             "mlp_only_layers", "final_logit_softcapping", "attn_logit_softcapping",
                             "hidden_activation", "qk_layernorm", "text_config", "norm_topk_prob"})
TYPES = ["llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3_text", "qwen3", "qwen3_moe", "phi", "phi3",
         "mixtral", "olmo2", "gemma3", "gpt9"]


@st.composite
def configs(draw):
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "any-json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "any-json":
        return json.dumps(draw(JSON)).encode()
    config = {**CONFIG, "model_type": draw(st.sampled_from(TYPES))}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            config.pop(key, None)
        else:
            config[key] = draw(JSON)
    return json.dumps(config).encode()


@examples(45)
@given(content=configs(), command=st.sampled_from(["estimate", "estimate", "advise", "measure"]))
def test_any_config_json_exits_0_or_2(work, content, command):
    cwd = work / "configs"
    cwd.mkdir(exist_ok=True)
    path = cwd / "config.json"
    path.write_bytes(content)
    argv = [command, "--model", str(path), "--gpu", "rtx-4090"]
    if command == "measure":  # the config is checked before a worker starts: a bad one never gets one
        argv += ["--device", "cpu", "--timeout", "30"]
        try:
            catalog.load_model.cache_clear()
            catalog.load_model(str(path))
            return  # a config the estimator reads would be measured: not this test's business
        except Exception:  # noqa: BLE001 - the CLI must turn it into exit 2
            pass
    catalog.load_model.cache_clear()
    code, text = run(argv, cwd)
    assert_clean(code, text)
    assert files_under(cwd) == {"config.json"}


# ----- sweep files -----------------------------------------------------------------------------
MODELS = ["llama-3.2-1b", "tinyllama-1.1b"]
GOOD = {"method": ["lora", "qlora", "full"], "precision": ["fp16-mixed", "bf16"], "batch": [1, 2], "seq": [512, 2048],
        "grad_ckpt": [True, False], "gpu_memory": ["48GiB"], "optimizer": ["adamw-8bit"]}
BAD = {"method": ["ful"], "precision": ["fp8"], "batch": [0, "x"], "seq": [4, 10**9], "gpus": [2, 1024],
       "sharding": ["ddp", "zero9"], "grad_ckpt": ["yes"], "lora_rank": [10**9], "gpu_memory": ["0GiB", "lots"],
       "precison": ["fp32"], "offload": ["params"], "quant": [None]}


def _cell_values(pool: list):
    return st.one_of(st.sampled_from(pool), st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True))


@st.composite
def sweeps(draw, model_path: str, clean: bool):
    models = MODELS + [model_path] + ([] if clean else ["llama-9b", "<b>x</b>"])
    gpus = ["rtx-4090", "t4"] + ([] if clean else ["rtx4090", "nosuch"])
    values = GOOD if clean else {k: GOOD.get(k, []) + BAD.get(k, []) for k in set(GOOD) | set(BAD)}
    grid = {"model": draw(_cell_values(models)), "gpu": draw(st.sampled_from(gpus))}
    for key in draw(st.lists(st.sampled_from(sorted(values)), max_size=3, unique=True)):
        grid[key] = draw(_cell_values(values[key]))
    doc = {"name": draw(st.sampled_from(["p"] if clean else ["p", "Bad Name", "p_2"])), "grids": [grid]}
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(values) + ["model", "gpu"]))
        doc["exclude"] = [{key: draw(st.sampled_from({"model": models, "gpu": gpus}.get(key) or values[key]))}]
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(values)))
        doc["override"] = [{"when": {"gpu": draw(st.sampled_from(gpus))}, "set": {key: draw(st.sampled_from(values[key]))}}]
    if clean:
        return yaml.safe_dump(doc, sort_keys=False).encode()
    if draw(st.integers(0, 5)) == 0:
        doc[draw(st.sampled_from(["grid", "measure", "train_tokens", "description"]))] = draw(JSON)
    text = yaml.safe_dump(doc, sort_keys=False)
    mutation = draw(st.sampled_from(["none", "duplicate", "latin-1", "bomb", "noise"]))
    if mutation == "duplicate":  # a key twice
        text = text.replace("grids:", "name: q\ngrids:", 1)
    elif mutation == "latin-1":  # not UTF-8
        return text.encode() + b"description: caf\xe9\n"
    elif mutation == "bomb":  # an alias bomb
        text += "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'a'] * 9)}]\n" for i in range(7))
    elif mutation == "noise":  # a few bytes of noise
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(alphabet="{}[]:&*!|>-#'\"\t\n ", max_size=4)) + text[cut:]
    return text.encode()


@pytest.fixture(scope="module")
def nasty_model(work) -> str:
    folder = work / "models" / "<img src=x onerror=alert(1)> [x](javascript:y)"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return str(folder)


def _sweep(work: Path, content: bytes) -> None:
    cwd = work / "sweeps"
    cwd.mkdir(exist_ok=True)
    for p in sorted(cwd.rglob("*"), reverse=True):  # a fresh folder per example
        p.unlink() if p.is_file() else p.rmdir()
    (cwd / "s.yaml").write_bytes(content)
    before = files_under(work.parent)
    code, text = run(["sweep", "s.yaml", "--results", "results", "--no-render"], cwd)
    assert_clean(code, text)
    new = files_under(work.parent) - before
    outside = [p for p in new if not p.startswith(f"{work.name}/sweeps/results")]
    assert not outside, outside
    if code == 2:
        assert not (cwd / "results").exists(), text


@examples(60)
@given(data=st.data())
def test_any_sweep_file_exits_0_or_2_and_writes_only_results(work, nasty_model, data):
    """Bad values, misspelled keys, duplicate keys, noise, an alias bomb, bytes that are not UTF-8."""
    _sweep(work, data.draw(sweeps(nasty_model, clean=False)))


@examples(10)
@given(data=st.data())
def test_valid_sweeps_write_only_under_results(work, nasty_model, data):
    """Valid sweeps (a model given by a path full of markup among them) run and write only results/."""
    _sweep(work, data.draw(sweeps(nasty_model, clean=True)))


# ----- pages --------------------------------------------------------------------------------------
class Tags(HTMLParser):
    """Every tag and attribute of a page, and the links' targets."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.hrefs: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        for name, value in attrs:
            self.attrs.add(name)
            if name in ("href", "src"):
                self.hrefs.append(value or "")


#: the Markdown extensions of mkdocs.yml that act on text (the theme's emoji and tabs add none)
EXTENSIONS = ["admonition", "attr_list", "md_in_html", "tables", "toc", "pymdownx.details", "pymdownx.superfences",
              "pymdownx.caret"]


@pytest.fixture(scope="module")
def fast_charts():
    """Charts are no text from input: a placeholder keeps each render to a second."""
    from reportgen.report import chartjobs

    real = chartjobs.draw_all
    chartjobs.draw_all = lambda jobs: ((j.key, "<svg/>") for j in jobs)
    yield
    chartjobs.draw_all = real


FOLDER_NAMES = st.lists(st.sampled_from(list("<>&\"'[](){}`|*_\\!#:=; aZ9é") + ["javascript:", "onerror=", "<img src=x ",
                                                                                "{ onclick=y ", "[x](javascript:y)", "`"]),
                        min_size=1, max_size=12).map("".join)


@examples(6)
@given(name=FOLDER_NAMES)
def test_no_page_holds_markup_from_a_model_path(work, fast_charts, name):
    import markdown  # mkdocs's own dependency (the site extra)

    from reportgen.report.render import render_all

    # every name opens a tag-like '<zqx', and ends with a Markdown link and an unclosed attribute list
    folder = work / "pages" / ("<zqx " + name + " [x](javascript:y) { onclick=y")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    cwd = work / "pages"
    (cwd / "s.yaml").write_text(yaml.safe_dump({"name": "p", "grids": [{"model": str(folder), "gpu": "rtx-4090",
                                                                      "method": "lora"}]}))
    code, text = run(["sweep", "s.yaml", "--results", "results", "--force", "--no-render"], cwd)
    assert_clean(code, text, allowed=(0,))
    docs = cwd / "docs"
    providers = ("reportgen.report.pages:home_pages", "reportgen.report.pages:gpu_pages",
                 "reportgen.report.pages:validation_pages", "reportgen.report.guides:guide_pages")
    render_all(cwd / "results", docs, published=None, commit=None, providers=providers)
    shown = 0
    for page in sorted(docs.rglob("*.md")):
        source = page.read_text()
        if "zqx" not in source:
            continue
        shown += 1
        html = markdown.markdown(source, extensions=EXTENSIONS)
        assert "<zqx" not in html, page
        tags = Tags()
        tags.feed(html)
        assert not {t for t in tags.tags if "zqx" in t or t == "script"}, page
        assert all(h.endswith(".svg") for h in tags.images), page  # the charts, nothing else
        assert not {a for a in tags.attrs if a.startswith("on") or "zqx" in a}, page
        assert not [h for h in tags.hrefs if re.sub(r"\s", "", h).lower().startswith("javascript:")], page
    assert shown >= 2  # the home grid and the GPU page at least



# ----- launch files (``--launch``, configs/launch.py) ---------------------------------------------
VENDORED = ROOT / "reportgen" / "configs" / "vendored" / "llamafactory" / "examples" / "accelerate"
LAUNCH_KEYS = sorted(json.loads((ROOT / "reportgen" / "configs" / "keys.json").read_text())["accelerate"]["keys"])
LF_TRAINING = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\nbf16: true\n"


@st.composite
def launch_files(draw):
    """A shipped accelerate config with keys set to anything, dropped, or added (nested ones in their section);
    now and then bytes or any JSON."""
    import yaml

    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "any-json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "any-json":
        return json.dumps(draw(JSON)).encode()
    doc = yaml.safe_load((VENDORED / draw(st.sampled_from(sorted(p.name for p in VENDORED.iterdir())))).read_text())
    for key in draw(st.lists(st.sampled_from(LAUNCH_KEYS), max_size=4, unique=True)):
        section, _, leaf = key.rpartition(".")
        where = doc.setdefault(section, {}) if section else doc
        if not isinstance(where, dict):
            continue
        if draw(st.integers(0, 4)) == 0:
            where.pop(leaf, None)
        else:
            where[leaf] = draw(st.one_of(JSON, st.sampled_from(["FSDP", "DEEPSPEED", "MULTI_GPU", "NO", "bf16", "fp16",
                                                                 "FULL_SHARD", "SHARD_GRAD_OP", True, 2, 8])))
    return yaml.safe_dump(doc, allow_unicode=True).encode()


@examples(40)
@given(content=launch_files(), command=st.sampled_from(["estimate", "estimate", "advise"]))
def test_any_launch_file_exits_0_or_2(work, content, command):
    cwd = work / "launch"
    cwd.mkdir(exist_ok=True)
    (cwd / "lf.yaml").write_text(LF_TRAINING)
    (cwd / "launch.yaml").write_bytes(content)
    code, text = run([command, "--from", "lf.yaml", "--launch", "launch.yaml", "--gpu", "rtx-4090"], cwd)
    assert_clean(code, text)
    assert files_under(cwd) == {"lf.yaml", "launch.yaml"}
