"""One training step, as the measuring harness runs it and the tracer replays it.

The loop of HF Trainer without its extras (``harness.py`` describes it): for each micro-batch,
``loss, out = forward(ids, mask, labels)`` under ``autocast()`` (by default
``model(input_ids, attention_mask, labels)``; ``harness.chunked_loss`` for torchtune's chunked
loss), ``loss = loss / accum``, ``del out`` (the logits die before the backward) unless the loop
keeps its outputs, ``loss.backward()`` (through the GradScaler for fp16-mixed); then
``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)``.

``keep`` (``TrainingSetup.keep_outputs``): ``step`` holds the micro-batches' outputs until after the
optimizer step; ``next-step`` holds the last one until the next forward returns (``kept`` carries
it from one call to the next). ``offload``: a context entered around each forward (activation
offloading). ``sync(last)``: a context around each micro-batch (DDP's ``no_sync`` on all but the
last). A batch is ``(input_ids, attention_mask, labels)`` or a bare ids tensor (labels = ids).

``mark(phase)`` is called where the step enters a phase (``forward``, ``backward``,
``optimizer-step``, ``zero-grad``, ``end``); the harness passes none, the tracer uses it to label
its allocation events. Calling it changes nothing in the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable


def _default_forward(model):
    def forward(ids, mask, labels):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        return out.loss, out

    return forward


def train_step(model, optimizer, batches: list, accum: int, autocast: Callable, scaler=None,
               last_loss: list | None = None, mark: Callable[[str], None] | None = None, *, keep: str = "none",
               kept: list | None = None, offload=None, forward: Callable | None = None,
               sync: Callable[[bool], contextlib.AbstractContextManager] | None = None) -> None:
    mark = mark or (lambda phase: None)
    forward = forward or _default_forward(model)
    kept = kept if kept is not None else []
    for i, batch in enumerate(batches):
        ids, mask, labels = batch if isinstance(batch, tuple) else (batch, None, batch)
        # multi-GPU: DDP's no_sync on every micro-batch but the last (distributed.micro_batch_sync)
        with sync(i == len(batches) - 1) if sync is not None else contextlib.nullcontext():
            mark("forward")
            with autocast(), (offload if offload is not None else contextlib.nullcontext()):
                loss, out = forward(ids, mask, labels)
            if keep == "next-step":
                kept[:] = [out]  # the previous step's outputs are released only now
            elif keep == "step":
                kept.append(out)
            loss = loss / accum
            del out
            mark("backward")
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if last_loss is not None:
                last_loss[:] = [loss.detach()]
            del loss
    mark("optimizer-step")
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    mark("zero-grad")
    optimizer.zero_grad(set_to_none=True)
    if keep == "step":
        kept.clear()
    mark("end")
