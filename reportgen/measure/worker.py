"""Entry point of the measuring subprocess: ``python -m reportgen.measure.worker REQUEST.json ANSWER.json``.

The parent (``isolate.py``) never imports torch; this process does, measures one case
(``harness.run``) and writes its answer atomically to ``ANSWER.json``. It first writes an interim
answer (status ``running``) holding the environment, so a parent that has to kill it on timeout,
or finds it dead, still knows which machine and software it ran on.

Once the answer is written the process ends with ``os._exit``: no interpreter teardown, so a CUDA
context left broken by the case (an illegal access after an OOM, a hung NCCL or Triton helper
thread, gigabytes of pinned host memory to unpin) can neither hang the exit until the parent's
timeout nor turn a written answer into a crash.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from reportgen.measure.protocol import MeasureRequest, answer, empty_measurement, tail
from reportgen.results import write_json_atomic


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m reportgen.measure.worker REQUEST.json ANSWER.json", file=sys.stderr)
        return 2
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
