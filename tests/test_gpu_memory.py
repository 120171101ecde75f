"""--gpu-memory / the sweep key gpu_memory: any card described by a catalog card's speed and a
memory size of the user's."""

import json

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.errors import UserError
from reportgen.sweep import load_sweep


@pytest.mark.parametrize("text, bytes_", [("48GiB", 48 * 2**30), ("24 GB", 24 * 10**9), ("23028MiB", 23028 * 2**20),
                                          ("0.5TiB", 2**39)])
def test_sizes_with_units(text, bytes_):
    assert catalog.parse_memory(text) == bytes_


@pytest.mark.parametrize("text, says", [("48G", "'G' is not a unit reportgen reads"),
                                        ("1KiB", "'KiB' is not a unit reportgen reads"),
                                        ("1e3GiB", "write the number in digits"),  # was "expected a size with its unit"
                                        ("48", "expected a size with its unit"), ("-1GiB", "expected a size with its unit"),
                                        ("lots", "expected a size with its unit")])
def test_sizes_without_a_clear_unit_are_refused(text, says):
    with pytest.raises(UserError, match=says):
        catalog.parse_memory(text)


@pytest.mark.parametrize("text, words", [("0GiB", "must be more than zero"), ("0.5MiB", "less than 64 MiB"),
                                         ("5TiB", "more than 4 TiB")])
def test_sizes_no_card_has_are_refused_as_such(text, words):
    """Issue 20: ``0GiB`` was "expected a size with its unit", which it has."""
    with pytest.raises(UserError, match=words):
        catalog.parse_memory(text)


def test_the_card_keeps_its_speed_and_takes_the_memory(capsys):
    gpu = catalog.load_gpu(catalog.gpu_key("rtx-4090", "48GiB"))
    base = catalog.load_gpu("rtx-4090")
    assert gpu.memory_bytes == 48 * 2**30 and gpu.peak_tflops == base.peak_tflops and gpu.key == "rtx-4090@48GiB"
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpu-memory", "48GiB", "--method",
                 "lora", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpu"] == "rtx-4090@48GiB" and d["capacity"] == 48 * 2**30
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "lora", "--format",
                 "json"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert d["max_batch"] > (small["max_batch"] or 0) and d["time"] == small["time"]


def test_sweep_key(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\ngrids:\n  - model: llama-3.2-1b\n    gpu: rtx-4090\n    gpu_memory: [24GiB, 48GiB]\n")
    cases = load_sweep(f).cases
    assert sorted(c.gpu for c in cases) == ["rtx-4090@24GiB", "rtx-4090@48GiB"]
    assert len({c.id for c in cases}) == 2
    f.write_text("name: s\ngrids:\n  - model: llama-3.2-1b\n    gpu: rtx-4090\n    gpu_memory: 48G\n")
    with pytest.raises(UserError, match=r"s.yaml:5: grids\[0\].gpu_memory"):
        load_sweep(f)
