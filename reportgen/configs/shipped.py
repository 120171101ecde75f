"""The DeepSpeed and accelerate configs LLaMA-Factory and Axolotl ship in their repositories, which their own
example configs name by a path relative to the repository's root (``deepspeed:
examples/deepspeed/ds_z3_config.json``; ``accelerate launch --config_file examples/accelerate/fsdp_config.yaml``;
Axolotl's ``deepspeed: deepspeed_configs/zero2.json``). The trainer opens that path in its working directory
(transformers' ``HfDeepSpeedConfig``, Axolotl's ``utils/config/__init__.py`` ``os.path.exists(cfg.deepspeed)``),
so the example runs from a checkout of the repository; reportgen, run anywhere else, reads the shipped file
instead when the path is not found, and says so.

The files under ``vendored/`` are copied unchanged (byte for byte) from the tools' published source
distributions, which hold them (the wheels do not):

* ``vendored/llamafactory/examples/{deepspeed,accelerate}/``: ``llamafactory-0.9.5.tar.gz`` (PyPI, sha256
  1702c0bfb864e80577a59521d2edcacd2aab05ec6aee06188fcba335a589681f), identical to the tag v0.9.5 of
  github.com/hiyouga/LLaMA-Factory (commit 7af909522a951e3ad9f022ea6f88b6755257eaa5);
* ``vendored/axolotl/deepspeed_configs/``: ``axolotl-0.19.0.tar.gz`` (PyPI, sha256
  136d623f04c909c5149d7f5dbd4a0e215014ab4c3617cce9d64010b5b8ca609d), identical to github.com/axolotl-ai-cloud/axolotl
  at commit 631268a0caa18250a30a1c837c4d7f4d9505adc0 (the last to change them; ``axolotl fetch deepspeed_configs``
  downloads the same files).

Torch-free: the calculator ships these files with the package's data.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from reportgen.configs import table

#: tool -> the folders (relative to its repository's root) whose files are shipped here
FOLDERS = {"llamafactory": ("examples/deepspeed", "examples/accelerate"), "axolotl": ("deepspeed_configs",)}


def files(tool: str) -> dict[str, str]:
    """The shipped files of ``tool``: their path relative to the tool's repository -> their text."""
    root = resources.files(__package__).joinpath("vendored", tool)
    out = {}
    for folder in FOLDERS.get(tool, ()):
        for entry in root.joinpath(folder).iterdir():
            if entry.name.endswith((".json", ".yaml")):
                out[f"{folder}/{entry.name}"] = entry.read_text(encoding="utf-8")
    return dict(sorted(out.items()))


def find(tool: str, value: str) -> tuple[str, str] | None:
    """The shipped file a path names (``examples/deepspeed/ds_z3_config.json``, also written ``./...``, as an
    absolute path into a checkout, or as the bare file name): (its path in the tool's repository, its text), or
    None when the name is none of the tool's shipped files."""
    parts = PurePosixPath(value.replace("\\", "/")).parts
    for rel, text in files(tool).items():
        want = PurePosixPath(rel).parts
        if parts == want[-1:] or parts[-len(want):] == want:
            return rel, text
    return None


def label(tool: str, rel: str) -> str:
    """How the report names a shipped file: ``LLaMA-Factory's shipped examples/deepspeed/ds_z3_config.json (0.9.5)``."""
    return f"{table.TOOLS[tool]}'s shipped {rel} ({table.version(tool)})"
