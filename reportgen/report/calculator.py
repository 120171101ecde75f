"""The calculator page: ``reportgen estimate`` in the reader's browser (GitHub issue 12, item 1).

``calculator_pages(site)`` returns one page, ``calculator/index.md`` (template ``calculator.md.j2``),
and the files it loads, all served from the built site (nothing from a third-party host):

* ``calculator/estimator-<hash>.json``: the estimator bundle, ``{"files": {path: text}}``, the source
  files ``bundle_paths()`` derives from the import graph (``reportgen/browser.py``, which the page
  calls, the CLI whose ``estimate`` command it runs, and the core and formulas they import, with
  their catalogs and data files) and PyYAML's pure-Python modules with its license
  (the catalog reads ``gpus.yaml`` with PyYAML; without its C extension ``yaml`` falls back to the
  pure-Python parser, so the browser parses the catalog with the same library as the CLI). The
  name carries a hash of the content, so a browser never runs a stale bundle from its cache;
* ``calculator/pyodide-<version>/``: Pyodide's core, taken unmodified from the npm tarball
  (``reportgen.report.pyodide``: pinned version and integrity hash, cached under ~/.cache/reportgen);
* ``calculator/third-party.txt``: where those come from and their licenses.

The form is generated here from ``TrainingSetup.model_fields`` (``reportgen.flags.form_fields``)
and the catalogs, so a new setup field appears on the page without editing it; the hand-written
``docs/javascripts/calculator.js`` reads the form, calls ``reportgen.browser.run`` and places the
rows it returns. Nothing is estimated while rendering: this module reads source files, catalog
entries and the runtime's bytes. Same inputs, same files.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from reportgen import __version__, catalog, layers
from reportgen.flags import DEFAULT_TRAIN_TOKENS, form_fields
from reportgen.fingerprint import ESTIMATOR_SOURCES, estimator_hash
from reportgen.report import pyodide
from reportgen.report.page import Page, SiteData
from reportgen.setup import METHOD_FIELDS, TrainingSetup
from reportgen.format import GIB

PATH = "calculator/index.md"
DIR = "calculator"
PACKAGE = Path(__file__).resolve().parents[1]

#: the modules the page runs: ``browser.run`` and the CLI whose ``estimate`` command it calls
ENTRIES = ("reportgen.browser", "reportgen.cli")
#: the highest layer the entries' imports are followed into (ARCHITECTURE.md: 0 core, 1 formulas);
#: the CLI's other commands import the producers, the pipeline and the site, which stay out
SHIPPED_LAYER = 1

#: the form's sections, in order; a setup field not listed here lands in "More settings"
GROUPS = (
    ("Technique", ("method", "precision", "optimizer", "frozen_dtype")),
    ("LoRA", ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora")),
    ("QLoRA", ("quant", "double_quant", "quant_head", "kbit_prep")),
    ("Batch and sequence", ("batch", "seq", "accum", "padding", "seq_mean", "seq_padded")),
    ("Memory savers", ("grad_ckpt", "attn", "loss", "kernels", "offload", "act_offload")),
    ("Training loop", ("recipe", "modeling", "rope_positions", "keep_outputs", "optimizer_in_backward", "compile")),
    ("GPUs", ("gpus", "sharding", "fsdp_param_dtype")),
    ("The whole run", ("eval_batch", "eval_seq", "eval_generate", "save", "load")),
    ("GRPO (recipe grpo)", TrainingSetup.GRPO_FIELDS),
)
#: methods a field matters for (the page greys it out and leaves it off the command otherwise)
APPLIES = METHOD_FIELDS
DEFAULT_MODEL = "llama-3.2-1b"
DEFAULT_GPU = "rtx-4090"


# ----- the estimator bundle ------------------------------------------------------------------------
def bundle_modules() -> set[str]:
    """The modules the browser imports: the entries and everything they reach in the core and the
    formulas (``layers.closure``)."""
    return layers.closure(ENTRIES, SHIPPED_LAYER)


def _package_data(folder: Path) -> set[Path]:
    """A package's data files: what is not Python inside its folder, down to (not into) subpackages."""
    out = set()
    for p in folder.iterdir():
        if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").exists():
            out |= _package_data(p)
        elif p.is_file() and p.suffix not in (".py", ".pyc"):
            out.add(p)
    return out


def bundle_paths() -> list[str]:
    """Every file the browser loads, relative to the package's parent, sorted: the source of
    ``bundle_modules()`` and of the packages they sit in, the data files of those packages but the
    top one (the catalogs, the error band, the config keys), and the sources of the estimator hash
    (``fingerprint.ESTIMATOR_SOURCES``), read as text so the hash the browser reports is the CLI's."""
    root = PACKAGE.parent
    files = set()
    for module in bundle_modules():
        parts = module.split(".")
        for n in range(1, len(parts)):  # the packages it sits in
            files.add(layers.module_path(".".join(parts[:n])))
        files.add(layers.module_path(module))
    files |= {d for f in list(files) if f.name == "__init__.py" and f.parent != PACKAGE for d in _package_data(f.parent)}
    files |= {p for pattern in ESTIMATOR_SOURCES for p in PACKAGE.glob(pattern) if p.is_file()}
    return sorted(p.relative_to(root).as_posix() for p in files)


def _pyyaml() -> tuple[dict[str, str], str, str]:
    """PyYAML's pure-Python modules as installed (``yaml/*.py``), its version and license text."""
    import importlib.metadata

    import yaml

    folder = Path(yaml.__file__).resolve().parent
    files = {f"yaml/{p.name}": p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))}
    dist = importlib.metadata.distribution("PyYAML")
    licenses = [f for f in dist.files or () if Path(str(f)).name.startswith(("LICENSE", "COPYING"))]
    if not licenses:
        raise FileNotFoundError("PyYAML's distribution lists no LICENSE file")
    return files, dist.version, Path(str(dist.locate_file(licenses[0]))).read_text(encoding="utf-8")


def bundle() -> tuple[str, str]:
    """``(file name, JSON text)`` of the estimator bundle; the name carries the content's hash."""
    files = {p: (PACKAGE.parent / p).read_text(encoding="utf-8") for p in bundle_paths()}
    yaml_files, yaml_version, yaml_license = _pyyaml()
    files.update(yaml_files)
    files["yaml/LICENSE"] = yaml_license
    text = json.dumps({"files": dict(sorted(files.items())), "pyyaml": yaml_version, "reportgen": __version__},
                      indent=0, sort_keys=True) + "\n"
    return f"estimator-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json", text


def third_party(runtime: bool) -> str:
    _, version, license_text = _pyyaml()
    parts = ["Third-party software served with reportgen's calculator page\n", "=" * 60 + "\n\n"]
    if runtime:
        parts.append(f"pyodide-{pyodide.VERSION}/\n" + pyodide.notice() + "\n")
    parts.append(f"PyYAML {version}: its pure-Python modules (yaml/*.py), unmodified, inside estimator-*.json;\n"
                 "source https://github.com/yaml/pyyaml. License:\n\n" + license_text.rstrip() + "\n")
    return "".join(parts)


# ----- the form ------------------------------------------------------------------------------------
def _applies(name: str) -> list[str]:
    return list(APPLIES.get(name, ()))


def _label(name: str) -> str:
    return name.replace("_", " ")


def form_groups() -> list[dict]:
    """The setup fields in their sections, each field as ``flags.form_fields`` describes it plus
    its label, the methods it matters for and the bounds as HTML attributes."""
    fields = {f["name"]: f for f in form_fields()}
    listed = {n for _, names in GROUPS for n in names}
    groups = [(title, [n for n in names if n in fields]) for title, names in GROUPS]
    groups.append(("More settings", [n for n in fields if n not in listed]))
    out = []
    for title, names in groups:
        if not names:
            continue
        items = []
        for n in names:
            f = dict(fields[n])
            f["label"] = _label(n)
            f["applies"] = " ".join(_applies(n))
            f["default_text"] = ("" if f["default"] is None else
                                 ("1" if f["default"] else "0") if f["kind"] == "bool" else str(f["default"]))
            f["step"] = "1" if f["kind"] == "int" else "any"
            items.append(f)
        out.append({"title": title, "fields": items})
    return out


def _compact(n: int) -> str:
    """``100000000`` -> ``1e8`` (as ``--train-tokens`` takes it), exact or not at all."""
    e = len(str(n)) - 1
    return f"{n // 10**e}e{e}" if e >= 4 and n % 10**e == 0 else str(n)


def _gpus() -> list[dict]:
    out = []
    for key in catalog.gpu_names():
        gpu = catalog.load_gpu(key)
        size = f"{gpu.memory_bytes / GIB:.1f} GiB"  # "RTX 3060 (12 GB)" gets "(12 GB, 12.0 GiB)", not two brackets
        out.append({"key": key, "label": f"{gpu.name[:-1]}, {size})" if gpu.name.endswith(")") else f"{gpu.name} ({size})"})
    return out


# ----- the provider --------------------------------------------------------------------------------
def calculator_pages(site: SiteData) -> list[Page]:
    bundle_name, bundle_text = bundle()
    files: dict[str, str | bytes] = {f"{DIR}/{bundle_name}": bundle_text}
    runtime_dir = f"pyodide-{pyodide.VERSION}/"
    missing = None
    try:
        runtime = pyodide.runtime_files()
    except pyodide.RuntimeUnavailable as exc:
        missing = str(exc)
        print(f"warning: the calculator page is rendered without its Python runtime ({exc}); render again "
              "with access to the npm registry (once: it is cached)", file=sys.stderr)
    else:
        for name, data in sorted(runtime.items()):
            files[f"{DIR}/{runtime_dir}{name}"] = data
        files[f"{DIR}/{runtime_dir}NOTICE.txt"] = pyodide.notice()
    files[f"{DIR}/third-party.txt"] = third_party(missing is None)
    models = catalog.model_names()
    gpus = _gpus()
    keys = [g["key"] for g in gpus]
    context = {
        "root": "../",
        "models": models,
        "default_model": DEFAULT_MODEL if DEFAULT_MODEL in models else models[0],
        "gpus": gpus,
        "default_gpu": DEFAULT_GPU if DEFAULT_GPU in keys else keys[0],
        "groups": form_groups(),
        "train_tokens": _compact(DEFAULT_TRAIN_TOKENS),
        "bundle": bundle_name,
        "runtime": None if missing else runtime_dir,
        "runtime_missing": missing,
        "pyodide_version": pyodide.VERSION,
        "reportgen_version": site.reportgen_version,
        "estimator_hash": estimator_hash(),
    }
    return [Page(path=PATH, template="calculator.md.j2", context=context, files=files)]
