"""Entry point of the measuring subprocess: ``python -m reportgen.measure.worker REQUEST.json ANSWER.json``.

The parent (``isolate.py``) never imports torch; this process does, measures one case
(``harness.run``) and writes its answer atomically to ``ANSWER.json``. It first writes an interim
answer (status ``running``) holding the environment, so a parent that has to kill it on timeout,
or finds it dead, still knows which machine and software it ran on.
"""

from __future__ import annotations

import json
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


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
