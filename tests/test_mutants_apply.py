"""The weekly mutation run (``scripts/mutate.py``) stops before running any mutant when one no longer
applies (its ``old`` text is not exactly once in its file). Checked on every run of the suite, so a
change that moves guarded code updates the mutant list in the same commit, not a week later."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_applies_to_the_code_as_it_is():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutate", mutate)  # its dataclasses look their module up
    spec.loader.exec_module(mutate)
    assert len(mutate.MUTANTS) >= 100
    assert mutate.check_applies(mutate.MUTANTS) == []
