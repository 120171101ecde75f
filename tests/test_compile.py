"""torch.compile as a setup field: off by default (HF Trainer's torch_compile=False), a flag, a sweep
key and a label; the harness refuses it until it runs it."""

import pytest

from reportgen.measure.harness import SetupNotSupported, check_supported
from reportgen.results import case_id
from reportgen.setup import TrainingSetup


def test_off_by_default_and_labelled():
    assert TrainingSetup().compile is False
    assert "compile" in TrainingSetup(compile=True).short()


def test_default_keeps_existing_case_ids():
    setup = TrainingSetup().model_dump(mode="json")
    without = {k: v for k, v in setup.items() if k != "compile"}
    assert case_id("llama-3.2-1b", "rtx-4090", setup) == case_id("llama-3.2-1b", "rtx-4090", without)


def test_the_harness_refuses_it_with_a_reason():
    with pytest.raises(SetupNotSupported, match="torch.compile"):
        check_supported(TrainingSetup(compile=True), "cpu")
