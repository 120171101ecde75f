"""Real CUDA measurements of the cases the estimator predicts (GitHub issue 4).

* ``cli.py``: ``reportgen measure`` (one case; ``--format json`` prints one object, ``protocol.py``);
* ``runner.py``: ``measure_sweep`` behind ``reportgen sweep FILE --measure [--shard I/N]``;
* ``isolate.py``: one subprocess per case, with a timeout (the caller never imports torch); a
  multi-GPU case runs torchrun, one worker per GPU (``distributed.py``: a rank's wrapping;
  ``ranks.py``: the command and the merge of the ranks' answers);
* ``cluster.py``: a sweep's cases as a Slurm job array through submitit (``--executor slurm``);
* ``worker.py``: that subprocess's entry point; ``harness.py``: the measurement itself;
  ``loop.py``: its step call, warm-up and timed loop;
* ``timing.py``: how many timed steps run and what their times say (median, spread, interval);
* ``profiling.py``: ``--profile``'s steps under torch.profiler; ``trace_stats.py``: per-step
  figures (GPU-busy time, kernels, CPU ops) from the trace's events;
* ``build.py``: the model of each recipe; ``optimizers.py``: the optimizer of each setup;
* ``environment.py``, ``nvml.py``: provenance and the driver's view of memory (the table of
  one measurement is ``views/measurement.py``).
"""
