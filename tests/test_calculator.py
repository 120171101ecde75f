"""The calculator page without a browser: what the page calls (``reportgen.browser``) prints what the
CLI prints, the estimator bundle holds every module that code imports (checked in a Python that can
import nothing else), the page and its files render byte for byte the same, and the Pyodide
runtime is taken only from the pinned, checked tarball."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import tarfile
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from reportgen import browser, catalog, flags, layers
from reportgen.cli import main
from reportgen.errors import UserError
from reportgen.fingerprint import ESTIMATOR_SOURCES
from reportgen.report import calculator, pyodide, render
from reportgen.report.page import SiteData
from reportgen.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]
MISTRAL = (ROOT / "reportgen" / "published" / "configs" / "mistral-7b-v0.1.json").read_text()
TRL_QLORA = (ROOT / "tests" / "fixtures" / "configs" / "trl_qlora.yaml").read_text()
H100_PROFILE = ROOT / "data" / "gpu-profiles" / "h100-sxm.20261127T203244Z.yaml"
#: LLaMA-Factory's LoRA SFT example (examples/train_lora/llama3_lora_sft.yaml's keys): the QLoRA fixture unquantized
LF_LORA = "".join(line for line in (ROOT / "tests" / "fixtures" / "configs" / "llamafactory_qlora.yaml").read_text()
                  .splitlines(keepends=True) if not line.startswith("quantization_"))
#: LLaMA-Factory's examples/accelerate/fsdp_config.yaml as shipped (2 processes, FULL_SHARD, bf16)
LF_FSDP = (ROOT / "reportgen" / "configs" / "vendored" / "llamafactory" / "examples" / "accelerate"
           / "fsdp_config.yaml").read_text()

#: (form the page sends, the command line it must show)
FORMS = [
    ({"model": "llama-3.2-1b", "gpu": "rtx-4090", "train_tokens": "1e8",
      "setup": {f["name"]: f["default"] for f in flags.form_fields()}},
     "reportgen estimate --model llama-3.2-1b --gpu rtx-4090"),
    ({"model": "llama-3.1-8b", "gpu": "a100-80gb",
      "setup": {"method": "lora", "lora_rank": "64", "lora_targets": "qv", "lora_dropout": "0.05", "batch": "4",
                "seq": "1024", "accum": "4", "padding": "packed", "grad_ckpt": False}},
     "reportgen estimate --model llama-3.1-8b --gpu a100-80gb --method lora --lora-rank 64 --lora-targets qv "
     "--lora-dropout 0.05 --batch 4 --seq 1024 --accum 4 --padding packed"),
    ({"model": "llama-3.1-8b", "gpu": "rtx-4090", "gpu_memory": "48GiB",
      "setup": {"method": "qlora", "double_quant": True, "grad_ckpt": True, "loss": "chunked", "batch": "2",
                "seq_mean": ""}},
     "reportgen estimate --model llama-3.1-8b --gpu rtx-4090 --gpu-memory 48GiB --method qlora --double-quant "
     "--grad-ckpt --loss chunked --batch 2"),
    ({"model": "llama-3.2-3b", "config": MISTRAL, "gpu": "t4", "train_tokens": "2e7",
      "setup": {"method": "qlora", "quant": "fp4", "grad_ckpt": True, "seq": "1024", "seq_mean": "600"}},
     "reportgen estimate --model config.json --gpu t4 --method qlora --quant fp4 --grad-ckpt --seq 1024 "
     "--seq-mean 600 --train-tokens 2e7"),
    ({"model": "llama-3.1-70b", "gpu": "h100-sxm",
      "setup": {"grad_ckpt": True, "batch": "2", "gpus": "8", "sharding": "fsdp"}},
     "reportgen estimate --model llama-3.1-70b --gpu h100-sxm --grad-ckpt --batch 2 --gpus 8 --sharding fsdp"),
    # a pasted GPU profile (reportgen profile-gpu): the page runs without pydantic, so its reader must too
    ({"model": "llama-3.2-1b", "gpu": "h100-sxm", "gpu_profile": H100_PROFILE.read_text()},
     "reportgen estimate --model llama-3.2-1b --gpu h100-sxm --gpu-profile gpu-profile.yaml"),
    # a pasted accelerate launch file beside a LLaMA-Factory config: the launcher, so the form's GPUs are not sent
    ({"model": "llama-3.2-1b", "gpu": "h100-sxm", "training_config": LF_LORA, "launch_config": LF_FSDP,
      "setup": {"method": "full", "gpus": "8", "sharding": "ddp"}},
     "reportgen estimate --gpu h100-sxm --from train.yaml --launch launch.yaml"),
    # a pasted TRL config gives the model and setup: of the form's setup only the launcher's GPUs are sent
    ({"model": "llama-3.2-1b", "gpu": "rtx-4090", "training_config": TRL_QLORA,
      "setup": {"method": "full", "batch": "3", "gpus": "1"}},
     "reportgen estimate --gpu rtx-4090 --from train.yaml"),
]


def cli_json(command: str) -> str:
    """What ``command --format json`` prints, run through ``reportgen.cli.main``."""
    catalog.load_model.cache_clear()  # a config.json written since the last call
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(shlex.split(command)[1:] + ["--format", "json"]) == 0
    return buf.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(browser, "_last_pasted", None)
    monkeypatch.setattr(browser, "_last_train", None)
    catalog.load_model.cache_clear()
    yield tmp_path
    catalog.load_model.cache_clear()


# ----- what the page calls -----------------------------------------------------------------------
@pytest.mark.parametrize("form, command", FORMS, ids=["full", "lora", "qlora-48gib", "pasted", "fsdp", "profile", "launch", "trl"])
def test_the_page_prints_what_the_cli_prints(form, command, workdir):
    out = json.loads(browser.run(json.dumps(form)))
    assert "error" not in out, out.get("error")
    assert out["command"] == command
    assert out["json"] == cli_json(command)  # the exact text, every number and the estimator hash
    data = json.loads(out["json"])
    assert out["view"] == browser.view(data)
    keys = [r["key"] for s in out["view"]["sections"] for r in s["rows"]]
    assert len(keys) == len(set(keys))
    assert {"memory.device_total", "time.tokens_per_s", "max_batch", "max_seq"} <= set(keys)


def test_a_pasted_training_config_reports_every_key(workdir):
    out = json.loads(browser.run(json.dumps(FORMS[-1][0])))
    assert json.loads(out["json"])["setup"]["method"] == "qlora"  # the file's, not the form's "full"
    assert out["from"][0] == "from train.yaml (TRL 1.16.0 keys): model qwen2.5-7b"
    assert any(line.startswith("ignored (no effect") and "learning_rate" in line for line in out["from"])
    bad = json.loads(browser.run(json.dumps({**FORMS[-1][0], "training_config": "use_peft: [\n"})))
    assert "train.yaml" in bad["error"]["message"] and "from" not in bad


LAUNCH_FORM = FORMS[-2][0]


def test_a_pasted_launch_file_runs_as_the_cli_with_from_and_launch(workdir):
    """LLaMA-Factory's ``accelerate launch --config_file examples/accelerate/fsdp_config.yaml``: 2 GPUs, FSDP
    FULL_SHARD, bf16, as ``reportgen estimate --from lf.yaml --launch examples/accelerate/fsdp_config.yaml`` reads
    them (the shipped file by its name), and the same numbers as the flags the launch file stands for."""
    out = json.loads(browser.run(json.dumps(LAUNCH_FORM)))
    setup = json.loads(out["json"])["setup"]
    assert (setup["gpus"], setup["sharding"], setup["precision"], setup["method"]) == (2, "fsdp", "bf16-mixed", "lora")
    (workdir / "lf.yaml").write_text(LF_LORA)
    shipped = cli_json("reportgen estimate --gpu h100-sxm --from lf.yaml --launch examples/accelerate/fsdp_config.yaml")
    assert json.loads(shipped)["setup"] == setup
    assert out["json"] == cli_json("reportgen estimate --gpu h100-sxm --from lf.yaml --gpus 2 --sharding fsdp")
    assert (workdir / "launch.yaml").read_text() == LF_FSDP
    launch = out["from"].index("launch launch.yaml (accelerate 1.15.0 config keys)")
    honoured = next(line for line in out["from"][launch:] if line.startswith("honoured:"))
    assert "num_processes" in honoured and "fsdp_config.fsdp_sharding_strategy" in honoured


@pytest.mark.parametrize("text, message", [
    (LF_FSDP.replace("FULL_SHARD", "FULL"), "launch.yaml:11: fsdp_config.fsdp_sharding_strategy: 'FULL' is not"),
    (LF_FSDP.replace("num_processes: 2", "num_processes: 1"), "launch.yaml:19: num_processes: FSDP over one process"),
    (LF_FSDP.replace("distributed_type: FSDP", "distributed_type: FSDP: 2"), "launch.yaml:3: not valid YAML"),
])
def test_a_bad_launch_file_is_the_clis_message_naming_its_line(text, message, workdir):
    out = json.loads(browser.run(json.dumps({**LAUNCH_FORM, "launch_config": text})))
    assert message in out["error"]["message"], out["error"]
    assert "Traceback" not in json.dumps(out) and "json" not in out and "from" not in out


def test_a_launch_file_without_a_training_config_is_not_sent(workdir):
    form = {"model": "llama-3.2-1b", "gpu": "h100-sxm", "launch_config": LF_FSDP}
    out = json.loads(browser.run(json.dumps(form)))
    assert out["command"] == "reportgen estimate --model llama-3.2-1b --gpu h100-sxm" and "error" not in out
    assert out["json"] == cli_json(out["command"]) and not (workdir / "launch.yaml").exists()
    assert browser.argv({**form, "setup": {"gpus": "2", "sharding": "fsdp"}})[-4:] == ["--gpus", "2", "--sharding", "fsdp"]


def test_a_pasted_gpu_profile_prices_the_step_as_the_cli_does(workdir):
    form = {"model": "llama-3.2-1b", "gpu": "h100-sxm", "gpu_profile": H100_PROFILE.read_text()}
    out = json.loads(browser.run(json.dumps(form)))
    assert out["command"] == "reportgen estimate --model llama-3.2-1b --gpu h100-sxm --gpu-profile gpu-profile.yaml"
    assert out["json"] == cli_json(out["command"])
    assert json.loads(out["json"])["gpu_profile"]["card"] == "h100-sxm"
    assert any("your card's profile" in n for n in out["view"]["notes"])
    other = json.loads(browser.run(json.dumps({**form, "gpu": "rtx-4090"})))
    assert "a profile of h100-sxm" in other["error"]["message"] and "json" not in other
    bad = json.loads(browser.run(json.dumps({**form, "gpu_profile": "kind: gpu-profile\n"})))
    assert "gpu-profile.yaml" in bad["error"]["message"]


def test_the_view_shows_every_term_and_the_reverse_answers(workdir):
    out = json.loads(browser.run(json.dumps(FORMS[2][0])))
    data = json.loads(out["json"])
    rows = {r["key"]: r for s in out["view"]["sections"] for r in s["rows"]}
    for term, value in data["memory"].items():
        if term not in browser.TOTALS and value:
            assert rows[f"memory.{term}"]["value"] == f"{value / 2**30:.2f}"
    assert data["max_batch"] > 1 and rows["max_batch"]["value"] == f"{data['max_batch']:,}"
    assert rows["max_seq"]["value"] == f"{data['max_seq']:,}"
    assert out["view"]["verdict"] == data["verdict"]
    assert data["gpu"] == "rtx-4090@48GiB" and data["capacity"] == 48 * 2**30


def test_a_new_pasted_config_is_read_again(workdir):
    form = dict(FORMS[3][0])
    first = json.loads(json.loads(browser.run(json.dumps(form)))["json"])
    config = json.loads(MISTRAL)
    config["num_hidden_layers"] = 16
    second = json.loads(json.loads(browser.run(json.dumps({**form, "config": json.dumps(config)})))["json"])
    assert second["params"]["total"] < first["params"]["total"]


@pytest.mark.parametrize("form, message", [
    ({"config": '{"model_type": "llama",,}', "gpu": "t4"}, "config.json:1: not valid JSON"),
    ({"config": '{"model_type": "llama"}', "gpu": "t4"}, "config.json"),
    ({"model": "llama-3.2-1b", "gpu": "rtx-4090", "gpu_memory": "48G"}, "GPU memory '48G'"),
    ({"model": "llama-3.2-1b", "gpu": "rtx-4090", "setup": {"batch": "0"}}, "--batch: must be >= 1 (got 0)"),
    ({"model": "llama-3.2-1b", "gpu": "rtx-4090", "setup": {"gpus": "2"}}, "--sharding: gpus=2 needs sharding"),
    ({"model": "llama-3.2-1b", "gpu": "rtx-4090", "setup": {"batch": "1.5"}}, "invalid int value: '1.5'"),
])
def test_user_errors_come_back_as_the_cli_message(form, message, workdir):
    out = json.loads(browser.run(json.dumps(form)))
    assert message in out["error"]["message"]
    assert "Traceback" not in json.dumps(out) and "json" not in out
    args = shlex.split(out["command"])[1:] + ["--format", "json"]
    with pytest.raises((UserError, SystemExit)):  # the CLI refuses the same command
        from reportgen.cli import build_parser, run_command

        run_command(build_parser().parse_args(args))


def test_argv_leaves_defaults_out_and_keeps_the_cli_order():
    setup = {"batch": "1", "seq": "2048", "lora_dropout": "0.0", "method": "full", "grad_ckpt": False,
             "seq_mean": "", "accum": "3", "precision": "bf16"}
    assert browser.argv({"model": "m", "gpu": "g", "setup": setup, "train_tokens": "100000000"}) == [
        "estimate", "--model", "m", "--gpu", "g", "--precision", "bf16", "--accum", "3"]
    fields = flags.form_fields()
    assert [f["name"] for f in fields] == list(TrainingSetup.model_fields)
    assert all(f["kind"] in ("enum", "int", "float", "bool", "str") for f in fields)
    # a module list is typed as text and sent only when it differs from the default
    assert browser.argv({"model": "m", "gpu": "g", "setup": {"lora_targets": " all-linear "}}) == [
        "estimate", "--model", "m", "--gpu", "g"]
    assert browser.argv({"model": "m", "gpu": "g", "setup": {"lora_targets": "q,v,lm_head"}}) == [
        "estimate", "--model", "m", "--gpu", "g", "--lora-targets", "q,v,lm_head"]


# ----- the bundle: everything the page runs, nothing else ----------------------------------------
def _bundle_dir(tmp_path: Path) -> Path:
    _, text = calculator.bundle()
    out = tmp_path / "bundle"
    for rel, content in json.loads(text)["files"].items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(content)
    return out


ISOLATED = textwrap.dedent("""
    import importlib.abc, json, sys
    bundle, stdlib = sys.argv[1], json.loads(sys.argv[2])
    allowed = set(stdlib) | {"reportgen", "yaml"}

    class OnlyTheBundle(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top not in allowed and top not in sys.builtin_module_names:
                raise ModuleNotFoundError(f"{name} is neither in the bundle nor in Pyodide's standard library")
            return None

    sys.meta_path.insert(0, OnlyTheBundle())
    sys.path.insert(0, bundle)
    from reportgen import browser
    forms = json.loads(sys.stdin.read())
    import os; os.chdir(sys.argv[3])
    print(json.dumps([json.loads(browser.run(json.dumps(f))) for f in forms]))
    outside = sorted(m for m, mod in sys.modules.items() if m.partition(".")[0] in ("reportgen", "yaml")
                     and not (getattr(mod, "__file__", None) or bundle).startswith(bundle))
    assert not outside, outside
    import yaml
    assert not yaml.__with_libyaml__
    print(json.dumps(sorted(sys.modules)))
""")


def _stdlib_names() -> list[str]:
    """Top-level modules of Pyodide's standard library: the pure-Python ones in its zip (from the
    cached runtime; without it, CPython's) and the C modules (``_struct``, ...) built into its wasm."""
    import importlib.util

    names = set()
    for n in sys.stdlib_module_names:
        spec = importlib.util.find_spec(n) if n not in sys.modules else sys.modules[n].__spec__
        origin = getattr(spec, "origin", None) or ""
        if origin in ("built-in", "frozen") or origin.endswith(".so"):
            names.add(n)
    try:
        data = pyodide.runtime_files(download=False)["python_stdlib.zip"]
    except pyodide.RuntimeUnavailable:
        return sorted(names | set(sys.stdlib_module_names))
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for n in z.namelist():
            top = n.split("/")[0]
            names.add(top[:-len(".pyc")] if top.endswith(".pyc") else top[:-3] if top.endswith(".py") else top)
    return sorted(names)


def test_the_bundle_holds_every_module_the_page_imports(tmp_path):
    bundle = _bundle_dir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    # LLaMA-Factory's deepspeed: examples/deepspeed/ds_z3_config.json, read from the bundle's vendored copy
    shipped_ds = {"gpu": "h100-sxm", "training_config": LF_LORA + "deepspeed: examples/deepspeed/ds_z3_config.json\n",
                  "setup": {"gpus": "2"}}
    forms = [f for f, _ in FORMS] + [shipped_ds, {"config": "{", "gpu": "t4"}]
    # -I -S: no site-packages (no editable install, no PyYAML C extension), only the bundle and the
    # standard library, and of that only what Pyodide ships
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", ISOLATED, str(bundle), json.dumps(_stdlib_names()),
                           str(work)], input=json.dumps(forms), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results, modules = (json.loads(line) for line in proc.stdout.splitlines())
    for (form, command), out in zip(FORMS, results):
        (tmp_path / "cli").mkdir(exist_ok=True)
        if "config" in form:
            (tmp_path / "cli" / "config.json").write_text(form["config"])
        if "training_config" in form:
            (tmp_path / "cli" / "train.yaml").write_text(form["training_config"])
        if "gpu_profile" in form:
            (tmp_path / "cli" / "gpu-profile.yaml").write_text(form["gpu_profile"])
        if "launch_config" in form:
            (tmp_path / "cli" / "launch.yaml").write_text(form["launch_config"])
        import os

        cwd = os.getcwd()
        os.chdir(tmp_path / "cli")
        try:
            assert out["json"] == cli_json(command), command  # same text: the hash of the same sources too
        finally:
            os.chdir(cwd)
    assert "not valid JSON" in results[-1]["error"]["message"]
    assert json.loads(results[-2]["json"])["setup"]["sharding"] == "zero3", results[-2].get("error")
    assert any("LLaMA-Factory's shipped examples/deepspeed/ds_z3_config.json" in line for line in results[-2]["from"])
    assert "reportgen.configs.launch" in modules and "launch launch.yaml" in " ".join(results[len(FORMS) - 2]["from"])
    assert "reportgen.estimate.search" in modules and "yaml.constructor" in modules
    assert "reportgen.configs.trl" in modules and results[len(FORMS) - 1]["from"][0].startswith("from train.yaml")
    assert not any(m.startswith(("reportgen.measure", "reportgen.report", "rich", "pydantic")) for m in modules)


def test_the_bundle_lists_its_sources_and_pyyaml_license():
    name, text = calculator.bundle()
    files = json.loads(text)["files"]
    assert name.startswith("estimator-") and name.endswith(".json")
    assert "yaml/LICENSE" in files and "Permission is hereby granted" in files["yaml/LICENSE"]
    for rel in ("reportgen/browser.py", "reportgen/cli.py", "reportgen/catalog/gpus.yaml",
                "reportgen/estimate/error_band.json", "reportgen/runner.py", "reportgen/results.py"):
        assert rel in files, rel
    assert all(f"reportgen/catalog/models/{m}.json" in files for m in catalog.model_names())
    # the DeepSpeed and accelerate files LLaMA-Factory's and Axolotl's examples name (configs/shipped.py), as shipped
    from reportgen.configs import shipped

    for tool, root in (("llamafactory", "reportgen/configs/vendored/llamafactory"),
                       ("axolotl", "reportgen/configs/vendored/axolotl")):
        assert shipped.files(tool) and all(files[f"{root}/{rel}"] == text for rel, text in shipped.files(tool).items())
    assert not any(".so" in f or "__pycache__" in f for f in files)


def test_the_bundle_is_what_the_browser_imports_from_the_core_and_formulas():
    """The file list is derived from the import graph: every module a shipped module imports is
    shipped (the entries' imports into layers 0 and 1, the CLI's other commands excepted), and nothing
    is shipped above the formulas but the two entries and the estimator hash's sources, which the
    browser reads as text and never imports (``runner.py``)."""
    paths = set(calculator.bundle_paths())
    shipped = {layers.module_name(layers.ROOT / p) for p in paths if p.endswith(".py")}
    hashed = {layers.module_name(p) for pattern in ESTIMATOR_SOURCES for p in layers.PACKAGE.glob(pattern)
              if p.suffix == ".py"}
    entries = set(calculator.ENTRIES)
    text_only = {m for m in hashed if layers.layer_of(m) > calculator.SHIPPED_LAYER}
    assert text_only == {"reportgen.runner"}, text_only
    outside = sorted(m for m in shipped - entries - text_only if layers.layer_of(m) > calculator.SHIPPED_LAYER)
    assert not outside, f"the calculator ships modules above the core and the formulas: {outside}"
    g = layers.graph()
    missing = sorted(f"{m} -> {i}" for m in shipped - text_only for i in g[m] if i not in shipped
                     and (m not in entries or layers.layer_of(i) <= calculator.SHIPPED_LAYER))
    assert not missing, f"the calculator misses modules its files import: {missing}"
    assert entries <= shipped and "reportgen/configs/keys.json" in paths and "reportgen/catalog/gpus.yaml" in paths
    assert "reportgen.configs.reverse" not in shipped  # the site's reverse table: nothing the browser imports


# ----- the page ----------------------------------------------------------------------------------
FAKE_RUNTIME = {n: (b"\0asm fake " + n.encode()) for n in pyodide.FILES}


@pytest.fixture
def fake_runtime(monkeypatch):
    monkeypatch.setattr(pyodide, "runtime_files", lambda download=True: dict(FAKE_RUNTIME))


SITE = SiteData(results={}, reportgen_version="0.1.0", git_commit=None)


def test_the_page_renders_byte_for_byte_the_same(fake_runtime, tmp_path):
    a, b = calculator.calculator_pages(SITE), calculator.calculator_pages(SITE)
    assert [(p.path, render.render_page(p), p.files) for p in a] == [(p.path, render.render_page(p), p.files)
                                                                     for p in b]
    spec = ("reportgen.report.calculator:calculator_pages",)
    for d in ("x", "y"):
        render.render_all(tmp_path / "results", tmp_path / d, published=None, commit=None, providers=spec)
    tree = {d: {p.relative_to(tmp_path / d).as_posix(): p.read_bytes() for p in sorted((tmp_path / d).rglob("*"))
                if p.is_file()} for d in ("x", "y")}
    assert tree["x"] == tree["y"]
    assert tree["x"]["calculator/pyodide-314.0.7/pyodide.asm.wasm"] == FAKE_RUNTIME["pyodide.asm.wasm"]


def test_the_form_has_every_setup_field_model_and_gpu(fake_runtime):
    page = calculator.calculator_pages(SITE)[0]
    text = render.render_page(page)
    for name in TrainingSetup.model_fields:
        assert text.count(f'name="setup.{name}"') == 1, name
    for name in catalog.model_names():
        assert f'<option value="{name}"' in text
    for key in catalog.gpu_names():
        assert f'<option value="{key}"' in text
    assert 'data-runtime="pyodide-314.0.7/"' in text and f'data-bundle="{page.context["bundle"]}"' in text
    assert f"calculator/{page.context['bundle']}" in page.files
    assert 'src="../javascripts/calculator.js"' in text and "rg-est" in text and "rg-legend" in text
    assert "\n\n" not in text[text.index('<div id="rg-calc"'):text.index("</form>")]  # one raw HTML block
    assert "MPL-2.0" in page.files["calculator/third-party.txt"]


def test_a_new_setup_field_appears_without_editing_the_page(fake_runtime, monkeypatch):
    from reportgen.setup import FieldSpec

    fields = {**TrainingSetup.model_fields, "new_knob": FieldSpec(int, ge=1, description="a field added later")}
    monkeypatch.setattr(TrainingSetup, "model_fields", fields)
    monkeypatch.setattr(TrainingSetup, "new_knob", 3, raising=False)
    groups = calculator.form_groups()
    assert groups[-1]["title"] == "More settings" and [f["name"] for f in groups[-1]["fields"]] == ["new_knob"]


def test_without_the_runtime_the_page_says_so(monkeypatch, capsys):
    def unavailable(download=True):
        raise pyodide.RuntimeUnavailable("offline")

    monkeypatch.setattr(pyodide, "runtime_files", unavailable)
    page = calculator.calculator_pages(SITE)[0]
    text = render.render_page(page)
    assert 'data-runtime=""' in text and "cannot run on this build" in text
    assert not any("pyodide-" in f for f in page.files)
    assert "without its Python runtime" in capsys.readouterr().err


# ----- the runtime: pinned and checked -----------------------------------------------------------
def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_runtime_is_checked_against_the_pinned_integrity(tmp_path, monkeypatch):
    monkeypatch.setenv("REPORTGEN_CACHE", str(tmp_path))
    data = _tarball(FAKE_RUNTIME)
    calls = []

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(url, timeout):
        calls.append(url)
        return Response(data)

    monkeypatch.setattr(pyodide.urllib.request, "urlopen", urlopen)
    with pytest.raises(pyodide.RuntimeUnavailable, match="integrity"):
        pyodide.tarball()
    assert calls == ["https://registry.npmjs.org/pyodide/-/pyodide-314.0.7.tgz"]
    assert not list(tmp_path.iterdir())  # nothing unchecked is cached
    with pytest.raises(pyodide.RuntimeUnavailable, match="missing"):
        pyodide.tarball(download=False)
    monkeypatch.setattr(pyodide, "INTEGRITY", pyodide.integrity_of(data))
    monkeypatch.setenv("npm_config_registry", "https://mirror.example/npm/")
    assert pyodide.runtime_files() == FAKE_RUNTIME
    assert calls[-1] == "https://mirror.example/npm/pyodide/-/pyodide-314.0.7.tgz"
    assert pyodide.runtime_files() == FAKE_RUNTIME and len(calls) == 2  # cached


def test_every_link_into_the_calculator_lands_on_an_element_of_it(fake_runtime):
    """The GPU, model and guide pages link ``calculator/index.md#gpu=KEY`` and ``#model=NAME``; each is an
    element id of the calculator page (its choice in the form), so MkDocs validates the anchors instead
    of printing one INFO line per link (issue 19: 42 of them on every `mkdocs serve`)."""
    import re

    from reportgen.report.guides import guide_pages
    from reportgen.report.pages import gpu_pages, model_pages

    text = render.render_page(calculator.calculator_pages(SITE)[0])
    ids = set(re.findall(r'id="([^"]+)"', text))
    anchors = set()
    for provider in (gpu_pages, model_pages, guide_pages):
        for page in provider(SITE):
            anchors |= set(re.findall(r"calculator/index\.md#([^)\s\"]+)", render.render_page(page)))
    assert anchors >= {"gpu=rtx-4090", "model=llama-3.1-8b"}
    assert anchors <= ids, sorted(anchors - ids)


def test_the_verdict_row_states_the_margin_in_gib(workdir):
    """The margin is bytes in the JSON and GiB (2^30 bytes) on the page: 1.5 GiB short reads -1.50."""
    data = json.loads(browser.estimate_json(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090"]))
    data["margin"] = -3 * 2**29
    (totals,) = [s["rows"] for s in browser.view(data)["sections"] if s["id"] == "totals"]
    (row,) = [r for r in totals if r["key"] == "verdict"]
    assert row["note"].startswith("margin -1.50 GiB of ")


def test_the_answer_shows_the_runs_phases_and_grpos():
    """The calculator's answer (browser.view) has a section per run phase, and with recipe grpo one per GRPO
    phase with the phases that decide the verdict and the time; a section with nothing to show is left out."""
    from reportgen import browser as B
    from reportgen.cli import main as cli_main

    def view_of(*args):
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert cli_main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--format", "json", *args]) == 0
        return {s["id"]: s for s in B.view(json.loads(buf.getvalue()))["sections"]}

    sft = view_of("--method", "lora", "--eval-batch", "4")
    assert [r["key"] for r in sft["run"]["rows"]] == ["run.load", "run.train", "run.eval", "run.save",
                                                       "run.not_counted"]
    assert "grpo" not in sft
    grpo = view_of("--recipe", "grpo", "--method", "lora", "--batch", "8", "--grad-ckpt")
    rows = {r["key"]: r for r in grpo["grpo"]["rows"]}
    assert {"grpo.generation", "grpo.policy-step", "grpo.max_num_generations"} <= set(rows)
    assert "decides the verdict" in rows["grpo.policy-step"]["note"]
    # the run around the GRPO step: load, the step, the adapter's save (run.py)
    assert [r["key"] for r in grpo["run"]["rows"]] == ["run.load", "run.train", "run.save", "run.not_counted"]
    ev = view_of("--recipe", "grpo", "--method", "lora", "--batch", "8", "--grad-ckpt", "--eval-batch", "256",
                 "--eval-generate", "4096")
    assert not any("decides the verdict" in r["note"] for r in ev["grpo"]["rows"])  # evaluation decides
    assert "reverse" in sft and "reverse" not in grpo  # a GRPO batch holds whole prompt groups: no batch search
    # the time of a setup that does not fit is said to be hypothetical and greyed, as on the terminal
    assert not sft["time"]["dim"] and "if it fit" not in sft["time"]["title"]
    big = view_of("--batch", "64")
    assert big["time"]["dim"] and big["time"]["title"].startswith("Time if it fit (it does not")


def test_a_card_whose_name_holds_its_size_is_labelled_with_one_bracket():
    """The GPU menu read "NVIDIA GeForce RTX 3060 (12 GB) (12.0 GiB)"."""
    from reportgen.report.calculator import _gpus

    labels = {g["key"]: g["label"] for g in _gpus()}
    assert labels["rtx-3060"] == "NVIDIA GeForce RTX 3060 (12 GB, 12.0 GiB)"
    assert labels["rtx-4090"] == "NVIDIA GeForce RTX 4090 (24.0 GiB)"
    assert not any(") (" in label for label in labels.values())
