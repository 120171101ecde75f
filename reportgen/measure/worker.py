"""Entry point of the measuring subprocess: ``python -m reportgen.measure.worker REQUEST.json ANSWER.json``.

The parent (``isolate.py``) never imports torch; this process does, measures one case
(``harness.run``) and writes its answer atomically to ``ANSWER.json``. It first writes an interim
answer (status ``running``) holding the environment, so a parent that has to kill it on timeout,
or finds it dead, still knows which machine and software it ran on.

Once the answer is written the process ends with ``os._exit``: no interpreter teardown, so a CUDA
context left broken by the case (an illegal access after an OOM, a hung NCCL or Triton helper
thread, gigabytes of pinned host memory to unpin) can neither hang the exit until the parent's
timeout nor turn a written answer into a crash.

A worker dies with its parent: ``lifeline.watch`` ends its process group and removes its scratch
folder when the parent ends (``--guard -- CMD`` runs torchrun under the same watch).

Under torchrun (a multi-GPU case: ``... REQUEST.json ANSWER.json --torchrun``) every rank runs
``rank_main``: it writes its pid, then its own interim and final answers to
``ANSWER.rank<R>.json`` (``distributed.rank_paths``; the interim one is rewritten at each phase, so
a timeout can say where every rank was), and ends with status 1 when its case failed, so torchrun
stops the other ranks at once instead of leaving them waiting in a collective. The parent merges
the rank files (``ranks.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from reportgen.measure.protocol import MeasureRequest, answer, empty_measurement, tail
from reportgen.results import write_json_atomic


def main(argv: list[str]) -> int:
    from reportgen.measure import lifeline
    from reportgen.measure.distributed import TORCHRUN_FLAG

    if argv[:1] == [lifeline.GUARD_FLAG]:  # torchrun under this process's lifeline (isolate.py)
        return lifeline.guard_main(argv[1:])
    lifeline.watch()  # this process and its helpers end when the parent does (lifeline.py)
    ranked = argv[2:] == [TORCHRUN_FLAG]
    if len(argv) != 2 and not ranked:
        print(f"usage: python -m reportgen.measure.worker REQUEST.json ANSWER.json [{TORCHRUN_FLAG}]", file=sys.stderr)
        return 2
    if ranked:
        return rank_main(Path(argv[0]), Path(argv[1]))
    request = MeasureRequest.from_file(Path(argv[0]))
    out = Path(argv[1])
    environment = None
    try:
        from reportgen.measure.environment import collect_environment

        environment = collect_environment(request.device)
        write_json_atomic(out, answer(request, "running", measurement=empty_measurement(), environment=environment))
        from reportgen.measure.harness import run

        result = run(request, environment)
    except Exception as exc:  # noqa: BLE001 - the harness returns failures itself; this is the last net
        result = answer(request, "error", measurement=empty_measurement(), environment=environment,
                        error=tail("".join(traceback.format_exception(exc))))
    write_json_atomic(out, json.loads(json.dumps(result, default=str)))
    return 0


def rank_main(request_path: Path, answer_path: Path) -> int:
    """One rank of a torchrun launch (module docstring)."""
    from reportgen.measure import distributed

    distributed.die_with_parent()
    rank_no = int(os.environ.get("RANK", "-1"))
    out, pid_file = distributed.rank_paths(answer_path, rank_no)
    pid_file.write_text(str(os.getpid()))
    request = MeasureRequest.from_file(request_path)
    environment = None
    result = None
    try:
        rank = distributed.Rank.from_env(request.device)
        from reportgen.measure.environment import collect_environment

        environment = collect_environment(request.device, index=rank.local_rank)
        environment.update(rank.environment())

        def interim(phase: str) -> None:
            write_json_atomic(out, answer(request, "running", environment=environment,
                                          measurement=dict(empty_measurement(), phase=phase, pid=os.getpid())))

        interim("setup")
        from reportgen.measure.harness import run

        result = run(request, environment, dist=rank, on_phase=interim)
    except Exception as exc:  # noqa: BLE001 - the harness returns failures itself; this is the last net
        result = answer(request, "error", environment=environment,
                        measurement=dict(empty_measurement(), failed_in="setup", failed_at=time.time()),
                        error=tail("".join(traceback.format_exception(exc))))
    write_json_atomic(out, json.loads(json.dumps(result, default=str)))
    if result["status"] != "ok":
        return 1  # torchrun stops the other ranks now
    return 0 if rank.finish() else 1


def _exit_now(code: int) -> None:
    """End the process without the interpreter's teardown (see the module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
