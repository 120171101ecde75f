"""TrainingSetup validates without pydantic (the estimator core must load under Pyodide) and keeps the
API the code uses."""

import subprocess
import sys

import pytest

from reportgen.setup import Method, SetupError, TrainingSetup


def test_values_are_coerced_and_checked():
    s = TrainingSetup(method="qlora", batch=4, lora_dropout=0)
    assert s.method is Method.qlora and s.lora_dropout == 0.0 and isinstance(s.lora_dropout, float)
    with pytest.raises(SetupError) as exc:
        TrainingSetup(batch=0)
    assert exc.value.field == "batch" and ">= 1" in exc.value.message
    with pytest.raises(SetupError, match="must be one of full, lora, qlora"):
        TrainingSetup(method="lorra")
    with pytest.raises(SetupError, match="whole number"):
        TrainingSetup(seq=True)
    with pytest.raises(SetupError, match="true or false"):
        TrainingSetup(grad_ckpt="yes")
    with pytest.raises(SetupError, match="needs sharding"):
        TrainingSetup(gpus=2)


def test_the_pydantic_style_api_round_trips():
    s = TrainingSetup(method="lora", precision="bf16", lora_targets="qv", seq=1024)
    d = s.model_dump(mode="json")
    # every field but those left out at their default (recipe, the run's and GRPO's: added after results were stored)
    assert d["method"] == "lora" and d["lora_targets"] == "qv"
    assert set(d) == set(TrainingSetup.model_fields) - set(TrainingSetup.DUMPED_ONLY_WHEN_SET)
    assert TrainingSetup.model_validate(d) == s == TrainingSetup.model_validate_json(s.model_dump_json())
    assert s.model_copy(update={"batch": 3}).batch == 3 and s.batch == 1
    with pytest.raises(SetupError, match="unknown setup field"):
        TrainingSetup.model_validate({**d, "lr": 1e-4})
    with pytest.raises(SetupError):
        s.model_copy(update={"batch": -1})  # copies are validated too
    assert hash(s) == hash(TrainingSetup.model_validate(d))


def test_the_estimator_core_imports_without_pydantic():
    code = ("import sys; sys.modules['pydantic'] = None; sys.modules['pydantic_core'] = None; "
            "from reportgen import catalog; from reportgen.estimate import estimate; "
            "from reportgen.setup import TrainingSetup; "
            "e = estimate(catalog.load_model('llama-3.2-1b'), catalog.load_gpu('t4'), TrainingSetup(method='lora')); "
            "print(e.verdict)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("fits", "tight", "does not fit")


@pytest.mark.parametrize("fields", [{}, {"method": "qlora", "seq_mean": 700, "kbit_prep": "none"},
                                    {"method": "full", "precision": "bf16", "optimizer_in_backward": True},
                                    {"method": "lora", "gpus": 2, "sharding": "fsdp", "recipe": "trl-sft"}])
@pytest.mark.parametrize("update", [{"batch": 7}, {"seq": 4096}, {"batch": 3, "seq": 1024}, {"seq": 512},
                                    {"batch": 0}, {"seq": 4}, {"batch": True}, {"seq": 2048.0}])
def test_a_copy_changing_batch_or_seq_is_the_setup_built_whole(fields, update):
    """The reverse searches' fast copy (``model_copy`` of batch/seq) gives the setup, the derived facts
    and the errors of building that setup from scratch."""
    setup = TrainingSetup(**fields)
    try:
        whole = TrainingSetup(**{**setup.model_dump(), **update})
    except SetupError as exc:
        with pytest.raises(SetupError) as copied:
            setup.model_copy(update=update)
        assert (copied.value.field, copied.value.message) == (exc.field, exc.message)
        return
    copy = setup.model_copy(update=update)
    assert copy == whole and hash(copy) == hash(whole) and copy.__dict__ == whole.__dict__
