"""What the measuring tests share: the tiny Llama config on disk, a two-case sweep file of it, and
``reportgen measure --format json`` run in process."""

from __future__ import annotations

import json
from pathlib import Path

from reportgen.cli import main
from tests.torch_saved import TINY


def tiny_config(directory: Path) -> Path:
    """The tiny Llama of ``torch_saved.TINY`` written as a config.json."""
    path = Path(directory) / "tiny-llama.json"
    path.write_text(json.dumps(TINY["llama"]))
    return path


def tiny_sweep(directory: Path, name: str) -> Path:
    """A sweep of the tiny Llama, full and LoRA at 16 tokens, measured with one warm-up and one step."""
    path = Path(directory) / "tiny.yaml"
    path.write_text(f"""
name: {name}
grids:
  - model: {tiny_config(directory)}
    gpu: h100-sxm
    method: [full, lora]
    seq: 16
measure: {{warmup: 1, steps: 1, max_steps: 1, timeout_s: 120}}
""")
    return path


def measure_json(capsys, *args) -> tuple[int, dict]:
    rc = main(["measure", *args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)  # exactly one object: json.loads fails on trailing data
