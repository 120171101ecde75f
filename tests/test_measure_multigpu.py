"""`reportgen measure --gpus 2 --sharding ddp|fsdp` on the CPU: torchrun starts two processes that
join a gloo group, each measures its own figures, the parent merges them into one answer (timings
present, memory null, as the single-process CPU run), the provenance rule keeps the run off every
GPU comparison, and a failing, dying or hanging rank is named in the answer within the time limit."""

from __future__ import annotations

import json
import time

import pytest

from reportgen.cli import main
from reportgen.measure.protocol import MEASUREMENT_KEYS
from reportgen.provenance import provenance_of
from tests.measure_helpers import measure_json, tiny_config

pytest.importorskip("torch.distributed.run")

FAST = ["--gpu", "h100-sxm", "--device", "cpu", "--gpus", "2", "--batch", "1", "--seq", "16", "--warmup", "1",
        "--steps", "1", "--max-steps", "1"]
MEMORY = ("peak_allocated", "peak_reserved", "device_used", "memory_after_load")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_config(tmp_path_factory.mktemp("cfg")))


#: DDP's wrap has no code that depends on the method; DDP over a LoRA model is built, wrapped and
#: run to its warm-up by test_a_failing_rank_is_named (a two-rank launch costs 12-25 s here)
@pytest.mark.parametrize("sharding,method", [("ddp", "full"), ("fsdp", "full"), ("fsdp", "lora")])
def test_two_ranks_on_cpu(capsys, tiny, sharding, method, tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"  # the temp folder of this run alone: what is left in it was left by the run
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--sharding", sharding, "--method", method)
    assert rc == 0 and d["status"] == "ok", d["error"]
    assert sorted(p.name for p in scratch.iterdir()) == []  # issue 29: torchrun left a torchelastic_* folder
    m, env = d["measurement"], d["environment"]
    assert set(MEASUREMENT_KEYS) <= set(m)
    # never mistaken for a single-GPU run
    assert m["world_size"] == 2 and len(m["ranks"]) == 2
    assert (env["world_size"], env["backend"], env["launcher"], env["device"]) == (2, "gloo", "torchrun", "cpu")
    assert "rank" not in env  # the run's environment; each rank's is in its entry
    for r, rank in enumerate(m["ranks"]):
        assert rank["rank"] == r and rank["status"] == "ok" and rank["error"] is None
        assert rank["environment"]["rank"] == r and rank["environment"]["device"] == "cpu"
        assert len(rank["step_times_s"]) == 1 and rank["step_times_s"][0] > 0
        assert rank["real_tokens_per_step"] == 16  # each rank its own micro-batch
        for key in MEMORY:
            assert rank[key] is None, key
    # the step ends with the slowest rank; tokens are counted over both
    assert m["step_times_s"] == [max(rank["step_times_s"][0] for rank in m["ranks"])]
    assert m["step_s"] == m["step_times_s"][0] and m["real_tokens_per_step"] == 32 and m["tokens_per_step"] == 32
    assert m["tokens_per_s"] == pytest.approx(32 / m["step_s"])
    for key in (*MEMORY, "mfu"):  # the CPU cannot say: null, as in the single-process CPU run
        assert m[key] is None, key
    assert m["loss_finite"] is True
    assert any(("DDP" if sharding == "ddp" else "FSDP2 fully_shard") in note for note in m["notes"])
    from reportgen import catalog
    from reportgen.estimate.params import lora_params
    from reportgen.setup import TrainingSetup

    spec = catalog.load_model(tiny)  # FSDP's sharded parameters count whole, as on one GPU
    assert m["params_trainable"] == (spec.total_params if method == "full" else
                                     lora_params(spec, TrainingSetup(method="lora")))
    # provenance: a CPU run of 2 processes counts for no GPU case
    p = provenance_of(d)
    assert p.world_size == 2 and p.device == "cpu" and p.mismatch is None
    assert p.valid_quantities("h100-sxm") == ()
    assert p.label("h100-sxm").startswith("CPU run") and "2 processes" in p.label("h100-sxm")


def test_a_failing_rank_is_named(capsys, monkeypatch, tiny):
    """An error on rank 1 only: the answer names rank 1 and its error; rank 0, whose all-reduce broke
    when rank 1 left, is listed as a consequence. Both end at once, not at the time limit. A LoRA
    model under DDP: built, wrapped and run up to the injected failure."""
    monkeypatch.setenv("REPORTGEN_FAULT", "error")
    monkeypatch.setenv("REPORTGEN_FAULT_RANK", "1")
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--sharding", "ddp", "--method", "lora", "--timeout", "300")
    assert rc == 1 and d["status"] == "error"
    m = d["measurement"]
    assert m["failed_rank"] == 1 and m["failed_in"] == "warmup"
    assert d["error"].startswith("rank 1 of 2 failed (error in warmup)")
    assert "injected failure" in d["error"]
    assert [r["status"] for r in m["ranks"]][1] == "error"
    assert m["ranks"][1]["fault_injected"] == "error" and "fault_injected" not in m["ranks"][0]
    assert d["wall_s"] < 200


def test_a_dying_rank_is_named(capsys, monkeypatch, tiny):
    monkeypatch.setenv("REPORTGEN_FAULT", "crash")  # SIGKILL in build
    monkeypatch.setenv("REPORTGEN_FAULT_RANK", "1")
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--sharding", "fsdp", "--timeout", "300")
    assert rc == 1 and d["status"] == "error"
    assert d["measurement"]["failed_rank"] == 1
    assert d["error"].startswith("rank 1 of 2 failed (died in build): rank 1 was killed by signal SIGKILL")
    assert d["measurement"]["ranks"][1]["status"] == "died"
    assert d["measurement"]["ranks"][0]["status"] in ("stopped", "error")
    assert d["wall_s"] < 200


def test_a_hanging_rank_times_out_and_every_process_is_killed(capsys, monkeypatch, tiny):
    monkeypatch.setenv("REPORTGEN_FAULT", "hang")  # rank 1 sleeps in build, rank 0 waits for it
    monkeypatch.setenv("REPORTGEN_FAULT_RANK", "1")
    t0 = time.perf_counter()
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--sharding", "ddp", "--timeout", "10")
    assert time.perf_counter() - t0 < 40
    assert rc == 1 and d["status"] == "timeout"
    assert d["error"].startswith("no result within 10 s: torchrun and all 2 ranks were killed (rank 0 in ")
    ranks = d["measurement"]["ranks"]
    assert [r["status"] for r in ranks] == ["killed", "killed"]
    from reportgen.measure.isolate import process_alive

    assert not any(process_alive(r["pid"]) for r in ranks if r.get("pid"))  # the ranks that had started are gone


def test_unsupported_multi_gpu_setups_are_refused_with_a_reason():
    from reportgen.measure.distributed import check_supported
    from reportgen.measure.optimizers import SetupNotSupported
    from reportgen.setup import TrainingSetup

    with pytest.raises(SetupNotSupported, match="processes were launched"):
        check_supported(TrainingSetup(gpus=4, sharding="ddp"), "cpu", 2)
    with pytest.raises(SetupNotSupported, match="DTensor"):
        check_supported(TrainingSetup(gpus=2, sharding="fsdp", optimizer="adamw-8bit"), "cpu", 2)
    with pytest.raises(SetupNotSupported, match="chunked"):
        check_supported(TrainingSetup(gpus=2, sharding="ddp", loss="chunked"), "cpu", 2)
    with pytest.raises(SetupNotSupported, match="optimizer_in_backward"):
        check_supported(TrainingSetup(gpus=2, sharding="fsdp", optimizer_in_backward=True), "cpu", 2)
    check_supported(TrainingSetup(gpus=2, sharding="fsdp", offload="params"), "cpu", 2)  # CPUOffloadPolicy


def test_snapshot_is_refused_for_several_processes(capsys, tiny):
    assert main(["measure", "--model", tiny, "--gpu", "h100-sxm", "--gpus", "2", "--sharding", "ddp",
                 "--snapshot", "snaps"]) == 2
    assert "--snapshot" in capsys.readouterr().err


# ----- the merge of the ranks' answers (no subprocess) ---------------------------------------------
def _request(gpus=2):
    from reportgen.measure.protocol import MeasureRequest
    from reportgen.setup import TrainingSetup

    setup = TrainingSetup(gpus=gpus, sharding="fsdp").model_dump(mode="json")
    return MeasureRequest(model="llama-3.1-8b", gpu="h100-sxm", setup=setup)


def _rank_answer(r, key="h100-sxm", peak=10 * 2**30, steps=(0.10, 0.30, 0.20), status="ok", error=None, **extra):
    from reportgen.measure.protocol import answer, empty_measurement

    env = {"device": "cuda", "gpu_catalog_key": key, "gpu_name": f"a {key}", "rank": r, "local_rank": r,
           "world_size": 2, "backend": "nccl", "launcher": "torchrun"}
    m = dict(empty_measurement(), peak_allocated=peak, peak_reserved=peak + 2**30, device_used=peak + 2**31,
             memory_after_load=2**30, step_times_s=list(steps), step_s=sorted(steps)[1], real_tokens_per_step=4096,
             tokens_per_step=8192, final_loss=2.0 + r, loss_finite=True, notes=["FSDP2 ..."], build_s=3.0,
             mfu=0.9, mfu_basis={"model_flops_per_token": 5e10, "gpu": key, "dtype": "bf16", "peak_flops": 1e15},
             **extra)
    return answer(_request(), status, measurement=m, environment=env, error=error)


def test_merge_takes_the_largest_rank_memory_and_the_slowest_rank_step():
    from reportgen.measure.ranks import merge

    answers = {0: _rank_answer(0, peak=10 * 2**30, steps=(0.10, 0.30, 0.20)),
               1: _rank_answer(1, peak=12 * 2**30, steps=(0.15, 0.25, 0.22))}
    d = merge(_request(), answers)
    m = d["measurement"]
    assert d["status"] == "ok" and d["error"] is None
    assert m["peak_allocated"] == 12 * 2**30 and m["peak_reserved"] == 13 * 2**30
    assert m["step_times_s"] == [0.15, 0.30, 0.22] and m["step_s"] == 0.22
    assert (m["step_s_min"], m["step_s_max"]) == (0.15, 0.30)
    assert m["real_tokens_per_step"] == 8192 and m["tokens_per_s"] == pytest.approx(8192 / 0.22)
    assert m["mfu"] == pytest.approx(5e10 * 8192 / 0.22 / (2 * 1e15)) and m["mfu_basis"]["gpus"] == 2
    assert [r["peak_allocated"] for r in m["ranks"]] == [10 * 2**30, 12 * 2**30]
    assert m["final_loss"] == 2.0 and m["world_size"] == 2 and m["build_s"] == 3.0
    assert d["environment"]["world_size"] == 2 and "rank" not in d["environment"]
    assert provenance_of(d).valid_quantities("h100-sxm") == ("peak_allocated", "peak_reserved", "device_total",
                                                            "tokens_per_s")


def test_merge_recomputes_the_timing_summary_and_cuda_times_over_the_ranks():
    from reportgen.measure.ranks import merge

    answers = {0: _rank_answer(0, steps=(0.10, 0.30, 0.20), step_times_cuda_s=[0.09, 0.29, 0.19],
                               stop_reason="time_cap", steps_run=3, step_s_iqr_rel=9.0),
               1: _rank_answer(1, steps=(0.15, 0.25, 0.22), step_times_cuda_s=[0.14, 0.24, 0.21],
                               stop_reason="time_cap", steps_run=3, step_s_iqr_rel=9.0)}
    m = merge(_request(), answers)["measurement"]
    assert m["step_times_cuda_s"] == [0.14, 0.29, 0.21] and m["step_s_cuda"] == 0.21
    assert m["steps_run"] == 3 and m["stop_reason"] == "time_cap" and m["timed_s"] == pytest.approx(0.67)
    # q1, q3 of (0.15, 0.22, 0.30) by linear interpolation: 0.185, 0.26 (never rank 0's own 9.0)
    assert m["step_s_iqr_rel"] == pytest.approx((0.26 - 0.185) / 0.22)
    assert [r["step_times_cuda_s"] for r in m["ranks"]] == [[0.09, 0.29, 0.19], [0.14, 0.24, 0.21]]


def _agree_worker(rank: int, path: str, port: int) -> None:
    import os

    import torch.distributed as dist

    from reportgen.measure.distributed import Rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    me = Rank(rank=rank, local_rank=rank, world_size=2, backend="gloo")
    seen = [me.agree_stop("stable" if rank == 0 else None, "cpu"),  # only rank 0 would stop: both go on
            me.agree_stop("stable" if rank == 0 else "time_cap", "cpu")]  # both would: each its own reason
    dist.destroy_process_group()
    with open(f"{path}.{rank}", "w") as f:
        json.dump(seen, f)


def test_ranks_stop_their_timed_steps_together(tmp_path):
    """Rank.agree_stop: a rank whose rule says stop goes on while another's does not (their steps
    run collectives, so every rank must run as many)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_agree_worker, args=(str(tmp_path / "seen"), port), nprocs=2, start_method="spawn")
    seen = [json.loads((tmp_path / f"seen.{r}").read_text()) for r in (0, 1)]
    assert seen == [[None, "stable"], [None, "time_cap"]]


def test_merge_names_the_rank_that_failed_first_not_the_ones_that_lost_it():
    from reportgen.measure.ranks import merge

    lost = _rank_answer(0, status="error", error="RuntimeError: Connection closed by peer",
                        failed_in="timed", failed_at=200.0, peer_lost=True)
    oom = _rank_answer(1, status="oom", error="CUDA out of memory. Tried to allocate 2.00 GiB",
                       failed_in="timed", failed_at=300.0, peer_lost=False)
    d = merge(_request(), {0: lost, 1: oom}, log="torchrun says things")
    assert d["status"] == "oom" and d["measurement"]["failed_rank"] == 1
    assert d["error"].startswith("rank 1 of 2 failed (oom in timed): CUDA out of memory")
    assert "rank 0: error in timed: RuntimeError: Connection closed by peer" in d["error"]
    assert d["measurement"]["peak_allocated"] is None  # no steady state was reached


def test_torchrun_summary_gives_the_rank_that_died():
    from reportgen.measure.ranks import torchrun_failures

    log = """Failures:
[1]:
  time      : 2026-11-23_02:37:41
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 29239)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_02:37:41
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 29240)  (SIGKILL)
"""
    assert torchrun_failures(log) == ({0: -15, 1: -9}, 1)
    assert torchrun_failures("no summary") == ({}, None)


def test_the_parent_side_never_imports_torch():
    """isolate, the merge and the cluster code run in the CLI's process, which stays free of torch."""
    import subprocess
    import sys

    code = ("import sys, reportgen.measure.isolate, reportgen.measure.ranks, reportgen.measure.cluster, "
            "reportgen.measure.distributed; print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


@pytest.mark.parametrize("setup,needle", [
    (dict(gpus=2, sharding="fsdp", optimizer="adamw-8bit"), "DTensor"),
    (dict(gpus=4, sharding="zero3"), "estimated only"),
    (dict(gpus=2, sharding="ddp", loss="chunked"), "chunked"),
    (dict(offload="params"), "not implemented by the harness"),
    (dict(compile=True), "torch.compile"),
])
def test_what_no_machine_measures_is_refused_by_the_parent_without_torch(setup, needle):
    """isolate.refusal: the answer a worker would give, with no worker (nor torchrun) started, for a
    CUDA request too (counting the GPUs is left to the ranks); the parent still never imports torch."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom reportgen.measure.isolate import refusal\n"
            "from reportgen.measure.protocol import MeasureRequest\n"
            f"print(json.dumps(refusal(MeasureRequest(model='llama-3.2-1b', gpu='h100-sxm', setup={setup!r}, "
            "device='cuda'))))\nprint('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    answer, torch_loaded = proc.stdout.strip().splitlines()
    d = json.loads(answer)
    assert d["status"] == "error" and needle in d["error"] and d["measurement"]["failed_in"] == "setup", d
    assert d["environment"]["source"] == "parent" and torch_loaded == "False"


def test_a_measurable_setup_is_not_refused_by_the_parent():
    from reportgen.measure.isolate import refusal
    from reportgen.measure.protocol import MeasureRequest

    for setup in ({}, dict(gpus=2, sharding="fsdp", offload="params"), dict(gpus=8, sharding="ddp")):
        assert refusal(MeasureRequest(model="llama-3.2-1b", gpu="h100-sxm", setup=setup, device="cuda")) is None


def test_a_rank_killed_from_outside_is_the_cause_even_if_the_other_reported_an_error():
    """The host's OOM killer SIGKILLs rank 0; rank 1 then fails with an error it cannot tell from its
    own. torchrun saw rank 0 go first: rank 0 is named."""
    from reportgen.measure.ranks import merge

    other = _rank_answer(1, status="error", error="RuntimeError: unexpected EOF", failed_in="timed", failed_at=1.0)
    log = """Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 4242)
"""
    running = {"status": "running", "measurement": {"phase": "timed", "pid": 4242}, "environment": None}
    d = merge(_request(), {0: running, 1: other}, log=log)
    assert d["status"] == "error" and d["measurement"]["failed_rank"] == 0
    assert d["error"].startswith("rank 0 of 2 failed (died in timed): rank 0 was killed by signal SIGKILL")


def test_a_sweeps_multi_gpu_case_records_how_it_ran(tmp_path, monkeypatch):
    """In a sweep's measurement file the settings of a 2-GPU case name its world size, launcher and
    backend; a 1-GPU case's settings stay as they were."""
    from reportgen.measure import runner
    from reportgen.measure.protocol import answer, empty_measurement
    from reportgen.setup import TrainingSetup
    from reportgen.sweep import Case

    monkeypatch.setattr(runner, "run_case", lambda request, timeout_s: answer(
        request, "ok", measurement=empty_measurement(), environment={"device": "cpu"}))
    settings = {"device": "cpu", "warmup": 1, "steps": 1, "timeout_s": 60, "cap_to_gpu": False}
    two = runner.measure_case(Case("llama-3.2-1b", "h100-sxm", TrainingSetup(gpus=2, sharding="fsdp")), settings, 60)
    assert two["settings"] == {**settings, "world_size": 2, "launcher": "torchrun", "backend": "gloo"}
    one = runner.measure_case(Case("llama-3.2-1b", "h100-sxm", TrainingSetup()), settings, 60)
    assert one["settings"] == settings
