"""What the parent asks the worker (``MeasureRequest``) and the shape of every answer.

The answer is one JSON object, the same for ``reportgen measure --format json`` and for the
``measurement`` block of a sweep's result file (which adds ``settings``, ``measured_at`` and
``wall_s``)::

    {"status": "ok" | "oom" | "error" | "timeout",
     "measurement": {<MEASUREMENT_KEYS>, ...} | null,
     "error": str | null,          # torch's OOM message, or the end of the traceback
     "environment": {...},         # environment.py
     "cap": null | {"emulated_gpu", "fraction", "limit_bytes", "device_total_bytes", ...},
     "case": {"model", "gpu", "setup"}}

Memory figures are bytes, times seconds. A figure the device cannot give (memory on CPU) is null,
never a guess. Fields added later (the timing summary of ``timing.py``, ``step_times_cuda_s``,
``profile``) are absent from older answers and files, never filled in for them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: the figures every ``measurement`` object has (null where the device cannot say)
MEASUREMENT_KEYS = ("peak_allocated", "peak_reserved", "device_used", "memory_after_load", "step_s", "step_s_min",
                    "step_s_max", "step_times_s", "tokens_per_s", "mfu")

#: statuses a finished measurement can have; ``running`` only appears in the worker's interim file
FINAL_STATUSES = ("ok", "oom", "error", "timeout")

#: how much of a traceback or stderr an error keeps
ERROR_TAIL_CHARS = 4000


@dataclass
class MeasureRequest:
    model: str  # catalog name or path to a config.json
    gpu: str  # catalog key: the card the case is for (and emulated with cap_to_gpu)
    setup: dict  # TrainingSetup.model_dump(mode="json")
    device: str = "cuda"
    warmup: int = 2
    steps: int = 5  # timed steps: the minimum (exactly this many when max_steps is None)
    cap_to_gpu: bool = False
    snapshot: str | None = None  # file to write a CUDA memory snapshot pickle to
    # the stopping rule of the timed steps (timing.py); None: not used (max_steps None: fixed count)
    max_steps: int | None = None
    max_timed_s: float | None = None
    target_rel_ci: float | None = None
    profile: str | None = None  # trace file to write: profile steps after the timed ones (profiling.py)
    profile_steps: int = 2
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_file(cls, path: Path) -> "MeasureRequest":
        return cls(**json.loads(Path(path).read_text()))

    def case(self) -> dict:
        return {"model": self.model, "gpu": self.gpu, "setup": self.setup}


def empty_measurement() -> dict:
    return {k: None for k in MEASUREMENT_KEYS}


def answer(request: MeasureRequest, status: str, *, measurement: dict | None = None, error: str | None = None,
           environment: dict | None = None, cap: dict | None = None) -> dict:
    return {"status": status, "measurement": measurement, "error": error, "environment": environment,
            "cap": cap, "case": request.case()}


def tail(text: str, limit: int = ERROR_TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]
