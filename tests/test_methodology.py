"""The methodology page: generated from the estimator's docstrings and constants, rendered with
StrictUndefined, answering the allocated / reserved / nvidia-smi question."""

from __future__ import annotations

import ast
from pathlib import Path

from reportgen.estimate import constants as K
from reportgen.report.methodology import MODULES, constants, function_doc, methodology_pages, module_doc, rst_to_md
from reportgen.report.page import SiteData
from tests.test_advise import make_site, render


def _text(site=None) -> str:
    site = site or SiteData(results={}, reportgen_version="test", git_commit=None)
    (page,) = methodology_pages(site)
    assert page.path == "methodology.md"
    return render(page)


def test_every_calibration_constant_is_in_the_table_with_its_status():
    text = _text()
    source = Path(K.__file__).read_text()
    names = [n.targets[0].id for n in ast.parse(source).body
             if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id != "MIB"]
    for name in names:
        assert f"| `{name}` |" in text, name
    rows = {c["name"]: c for c in constants("reportgen.estimate.constants")}
    assert rows["CUDA_CONTEXT_BYTES"]["status"] == "fitted" and rows["CUDA_CONTEXT_BYTES"]["value"].startswith("758 MiB")
    assert rows["CACHED_AFTER_RELEASE"]["status"] == "ASSUMED"
    assert rows["CUBLAS_WORKSPACE_HOPPER"]["status"] == "from source"
    # consecutive assignments share the comment above them
    assert rows["CUBLAS_WORKSPACE_OTHER"]["comment"] == rows["CUBLAS_WORKSPACE_HOPPER"]["comment"]


def test_every_documented_estimator_function_is_listed():
    text = _text()
    for module in MODULES:
        doc = module_doc(module)
        assert f"`{doc['path']}`" in text
        for f in doc["functions"]:
            assert f"**`{f['name']}`**" in text, f["ref"]
    assert "Korthikanti" in text and "Dettmers" in text and "0.127" in text


def test_answers_the_memory_numbers_question_with_a_diagram():
    text = _text()
    for needle in ("torch.cuda.max_memory_allocated()", "torch.cuda.max_memory_reserved()", "nvidia-smi",
                   "CUDA context", "managed memory", "fragmentation", "```mermaid\nflowchart TB", "NVML"):
        assert needle in text, needle
    assert "No measurements yet" in text
    for needle in ("Mixtral", "PCIe", "layout", "saved_tensors_hooks", "H100"):
        assert needle in text, needle


def test_says_how_many_cases_are_measured():
    env = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_catalog_key": "h100-sxm"}
    measured = {"id": "x", "case": {"model": "m", "gpu": "h100-sxm", "setup": {}}, "status": "ok", "estimate": None,
                "measurement": {"status": "ok", "fake": True, "environment": env,
                                "measurement": {"peak_allocated": 2**30, "tokens_per_s": 10.0}}}
    cpu = {**measured, "id": "y", "measurement": {**measured["measurement"], "environment": {"device": "cpu"}}}
    text = _text(make_site({"s": [measured, cpu]}))
    assert "1 of 2 cases have a measurement that counts (2 measurement files)" in text  # a CPU run does not
    assert "Measured on: NVIDIA H100 80GB HBM3" in text
    assert "No measurements yet" not in text


def test_docstrings_become_markdown():
    assert rst_to_md("uses ``x.float()`` and\n* a list") == "uses `x.float()` and\n\n* a list"
    doc = function_doc("reportgen.estimate.params:quant_constants_bytes")
    assert "0.127 bit/param" in doc["doc"] and doc["path"] == "reportgen/estimate/params.py"
