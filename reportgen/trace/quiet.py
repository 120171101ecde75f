"""Keep the libraries' chatter out of a traced answer, at its source.

What each line quiets, and why it says nothing about the traced step (real errors still raise):

* ``TRANSFORMERS_VERBOSITY=error``, ``FutureWarning`` and ``DeprecationWarning``: transformers' and
  torch's notices about APIs of later releases (torch's pytree deprecation among them).
* the ``torchao`` logger: torchao's optional C++ kernels that do not load on this machine.
* the ``bitsandbytes.backends.cpu.ops`` logger: bitsandbytes 0.50 (``backends/cpu/ops.py``), on a
  CPU with AVX512-BF16, tries at import time to fetch a CPU 4-bit GEMM from the Hugging Face Hub
  through the ``kernels`` package and logs a warning ("Failed to load CPU gemm_4bit_forward from
  kernels-community ... pip install kernels") when that package is absent. peft imports
  bitsandbytes whenever it is installed, so every trace printed the line, LoRA ones included. The
  trace never runs that kernel (it runs on the meta device, ``trace/kernels.py`` registers its own
  4-bit ops), so the message is noise. ``kernels`` is deliberately in no extra of reportgen: with it
  installed bitsandbytes downloads a kernel from the Hub at import time, which a trace or a test
  (both offline by design) must never do. Only that one module's logger is quieted, so bitsandbytes'
  other warnings still reach a measurement's log.
"""

from __future__ import annotations

import logging
import os
import warnings

#: loggers whose warnings are import-time noise for a trace (see the module's docstring)
QUIET_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes.backends.cpu.ops")


def quiet_libraries() -> None:
    """Set the filters and logger levels above; call it before torch, peft or bitsandbytes is
    imported (the bitsandbytes warning is logged while its module is imported)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        import torch  # noqa: F401  (torch sets up its loggers on import: quiet them after)
    except ImportError:
        return  # the command says which extra to install
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
