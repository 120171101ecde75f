"""The host CPU that dispatches the step (issue 30): the H100 machine's dispatch constants scaled by
single-thread speed (``estimate/dispatch.py``), a default host per kind of card, ``--host-cpu`` to name
yours, and a profile's measured host over any catalog figure."""

from __future__ import annotations

import dataclasses
import json

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.estimate import constants as K
from reportgen.estimate import estimate
from reportgen.estimate.dispatch import host_dispatch
from reportgen.estimate.time import TimeConstants
from reportgen.gpu_profile import GpuProfile, attach
from reportgen.setup import TrainingSetup

#: a host-bound step: a 1B model's LoRA step at batch 1, 512 tokens, where dispatch is most of the step
HOST_BOUND = dict(method="lora", batch=1, seq=512)


def _est(gpu, **setup):
    return estimate(catalog.load_model("llama-3.2-1b"), gpu, TrainingSetup(**setup))


def _profile(card: str, host_s_per_launch: float | None) -> GpuProfile:
    """A profile of ``card`` that measured the host's dispatch per CUDA op (or nothing, None)."""
    return GpuProfile(card=card, device="cpu", source="mine.yaml", gpu_name=None, cpu="Test CPU", utc=None,
                      host_s_per_op=None, host_s_per_launch=host_s_per_launch, kernel_device_s=None, matmul_tflops=(),
                      copy_1gib_gbs=None, host_link_gbs=None, cpu_adam_params_per_s=None, cuda_context_bytes=None,
                      memory_total_bytes=None, memory_free_bytes=None)


def test_dispatch_scales_by_single_thread_speed_worked_example():
    """Worked example (dispatch.py): the default desktop, a Ryzen 5 7600X at PassMark single-thread 4,221,
    against the H100 machine's 3,004: its dispatch constants are x 3004/4221 = 0.7117 the fitted ones, and
    a step's host time (dispatch only: linear in them) shrinks by exactly that factor."""
    desktop = catalog.load_cpu("amd-ryzen-5-7600x")
    assert (desktop.single_thread, catalog.default_cpu("reference").single_thread) == (4221, 3004)
    gpu = catalog.load_gpu("rtx-4090")
    c = TimeConstants.current(gpu, dtype="bf16")
    assert host_dispatch(gpu).factor == pytest.approx(0.71168, abs=1e-5)
    for name, fitted in (("host_s_per_kernel", K.HOST_S_PER_KERNEL), ("host_s_per_call", K.HOST_S_PER_CALL),
                         ("host_s_per_autocast_kernel", K.HOST_S_PER_AUTOCAST_KERNEL)):
        assert getattr(c, name) == pytest.approx(fitted * 3004 / 4221, rel=1e-12)
    on_reference = dataclasses.replace(gpu, host_cpu=catalog.load_cpu("h100-machine"))
    mine, theirs = _est(gpu, **HOST_BOUND).time, _est(on_reference, **HOST_BOUND).time
    assert mine.parts["host"] / theirs.parts["host"] == pytest.approx(3004 / 4221, rel=1e-9)
    assert mine.step_s < theirs.step_s  # a faster host: a shorter host-bound step


@pytest.mark.parametrize("card,role,cpu", [
    ("rtx-3090", "desktop", "amd-ryzen-5-7600x"), ("rtx-4090", "desktop", "amd-ryzen-5-7600x"),
    ("rtx-5090", "desktop", "amd-ryzen-5-7600x"), ("rtx-a6000", "desktop", "amd-ryzen-5-7600x"),
    ("rtx-6000-ada", "desktop", "amd-ryzen-5-7600x"), ("t4", "server", "amd-epyc-9454p"),
    ("l4", "server", "amd-epyc-9454p"), ("a100-80gb", "server", "amd-epyc-9454p"),
    ("h200", "server", "amd-epyc-9454p"), ("h100-sxm", "reference", "h100-machine"),
])
def test_each_kind_of_card_has_its_default_host(card, role, cpu):
    """GeForce and workstation cards assume a desktop, data-center cards a server, and the H100 SXM the
    machine the constants were fitted on, so that its numbers do not move (factor exactly 1)."""
    gpu = catalog.load_gpu(card)
    d = host_dispatch(gpu)
    assert (d.why, d.cpu.key) == (role, cpu)
    assert catalog.load_gpu(f"{card}@48GiB").default_host == gpu.default_host  # another memory: the same card
    if role == "reference":
        c = TimeConstants.current(gpu, dtype="bf16")
        assert (c.host_s_per_kernel, c.host_s_per_call, c.host_s_per_autocast_kernel) == (
            K.HOST_S_PER_KERNEL, K.HOST_S_PER_CALL, K.HOST_S_PER_AUTOCAST_KERNEL)


def test_every_estimate_says_which_host_it_assumes(capsys):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    h = out["time"]["host_dispatch"]
    assert (h["cpu"], h["why"], h["single_thread"], h["reference_single_thread"]) == (
        "amd-ryzen-5-7600x", "desktop", 4221, 3004)
    assert "PassMark" in h["source"]
    assert any(n.startswith("host dispatch: AMD Ryzen 5 7600X (default desktop)") and "x0.71" in n
               for n in out["notes"])


def test_host_cpu_flag_overrides_the_default(capsys):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--host-cpu", "amd-epyc-7502p",
                 "--format", "json"]) == 0
    h = json.loads(capsys.readouterr().out)["time"]["host_dispatch"]
    assert (h["cpu"], h["why"]) == ("amd-epyc-7502p", "--host-cpu")
    assert h["factor"] == pytest.approx(3004 / 1894)
    assert main(["advise", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--host-cpu", "amd-epyc-7502p",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["host_dispatch"]["cpu"] == "amd-epyc-7502p"


@pytest.mark.parametrize("command", ["estimate", "advise"])
def test_an_unknown_host_cpu_exits_2_with_the_close_names(capsys, command):
    code = main([command, "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--host-cpu", "ryzen-7600x"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "Traceback" not in err
    assert "--host-cpu: unknown host CPU 'ryzen-7600x'" in err and "did you mean 'amd-ryzen-5-7600x'" in err


def test_a_profile_that_measured_the_host_wins_over_the_catalog():
    """A profile's measured dispatch (twice the H100 machine's per CUDA op) prices the step, whatever the
    card's default or --host-cpu says; a profile that measured no host leaves the catalog's host."""
    gpu = dataclasses.replace(catalog.load_gpu("rtx-4090"), host_cpu=catalog.load_cpu("amd-epyc-7502p"))
    slow = attach(gpu, _profile("rtx-4090", 2 * K.REFERENCE_PROFILE["host_s_per_launch"]))
    d = host_dispatch(slow)
    assert (d.why, d.factor, d.cpu) == ("profile", pytest.approx(2.0), None)
    assert TimeConstants.current(slow, dtype="bf16").host_s_per_kernel == pytest.approx(2 * K.HOST_S_PER_KERNEL)
    assert "host dispatch: measured by your profile (Test CPU, mine.yaml), x2.00 the H100 machine's" in _est(
        slow, **HOST_BOUND).time.notes
    unmeasured = attach(gpu, _profile("rtx-4090", None))
    assert host_dispatch(unmeasured).why == "--host-cpu"
    assert TimeConstants.current(unmeasured, dtype="bf16").host_s_per_kernel == pytest.approx(
        K.HOST_S_PER_KERNEL * 3004 / 1894)


def test_every_catalog_cpu_has_a_figure_and_its_source():
    for key in catalog.cpu_names():
        c = catalog.load_cpu(key)
        assert c.single_thread > 0 and c.kind in ("desktop", "laptop", "server")
        assert "PassMark" in c.source or key == "h100-machine", key
    for card in catalog.gpu_names():
        assert catalog.load_gpu(card).default_host in ("desktop", "server", "reference"), card


SWEEP = """name: hosted
{host}grids:
  - model: llama-3.2-1b
    gpu: rtx-4090
    method: lora
    batch: 1
    seq: 512
"""


def _hosted(tmp_path, host: str) -> dict:
    (tmp_path / "s.yaml").write_text(SWEEP.format(host=host))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--results", str(tmp_path / "r"), "--no-render"]) == 0
    [doc] = [json.loads(p.read_text()) for p in (tmp_path / "r" / "hosted").glob("*.json")]
    return doc


def test_a_sweeps_host_cpu_prices_every_case_on_that_host_and_recomputes_it(tmp_path):
    """``host_cpu:`` in a sweep file is ``--host-cpu`` for every case: the stored estimate names the host
    and its dispatch, and naming another host recomputes the case (its inputs changed)."""
    default = _hosted(tmp_path, "")
    slow = _hosted(tmp_path, "host_cpu: amd-epyc-7502p\n")
    assert "host_cpu" not in default and slow["host_cpu"] == "amd-epyc-7502p"
    assert slow["inputs_hash"] != default["inputs_hash"]
    assert slow["estimate"]["time"]["host_dispatch"]["cpu"] == "amd-epyc-7502p"
    assert default["estimate"]["time"]["host_dispatch"]["cpu"] == "amd-ryzen-5-7600x"  # a GeForce's desktop
    ratio = 4221 / 1894  # PassMark single-thread: the desktop default over the old EPYC (cpus.yaml)
    assert slow["estimate"]["time"]["parts"]["host"] == pytest.approx(
        ratio * default["estimate"]["time"]["parts"]["host"], rel=1e-6)


def test_a_sweeps_unknown_host_cpu_names_its_line_and_the_close_names(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(SWEEP.format(host="host_cpu: amd-ryzen-5-7600\n"))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--results", str(tmp_path / "r"), "--no-render"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 's.yaml'}:2: host_cpu: unknown host CPU 'amd-ryzen-5-7600'" in err
    assert "amd-ryzen-5-7600x" in err and "Traceback" not in err
