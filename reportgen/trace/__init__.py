"""reportgen trace: the harness's real training step on storage-less tensors, its allocations
replayed through a model of PyTorch's CUDA caching allocator. Numbers are labelled "traced".

Modules (torch is imported only inside the functions that need it, never by the CLI's parser):

* ``step.py``: build the case's model on the meta device with ``measure/build.py`` and run
  ``measure/step.py``'s ``train_step`` (warm-up, reset, measured step) under the recorder;
* ``recorder.py``: the ``TorchDispatchMode`` that records every allocation and free with its op,
  phase and category;
* ``autocast.py``, ``functions.py``, ``kernels.py``, ``emulations.py``: what the meta device does
  differently from the CUDA run, each emulation a small named function with its source;
* ``allocator.py``: the caching-allocator simulation; ``replay.py``: events -> peaks per phase and
  the tensors alive at the peak;
* ``result.py``: one traced case with ``reportgen estimate``'s JSON fields; ``spec.py``: models of any
  family; ``cli.py``: ``reportgen trace`` (its printer is ``reportgen/views/trace.py``).
"""
