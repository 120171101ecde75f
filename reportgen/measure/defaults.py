"""The measuring harness's default settings, in one place without pydantic: a sweep's ``measure:``
section (``sweep.MeasureConfig``) and ``reportgen measure``'s flags share them, and building the
command line's parser (for every command, ``reportgen estimate`` too) need not import pydantic."""

#: untimed steps first (optimizer states appear there)
WARMUP = 3
#: the minimum number of timed steps
STEPS = 5
#: the most timed steps when a run does not say (``max_steps``: the larger of this and ``steps``)
MAX_STEPS = 50
#: time cap on the timed steps' wall times, seconds
MAX_TIMED_S = 5.0
#: stop once the median is known to +- this fraction at 95 %
TARGET_REL_CI = 0.02
#: a case's time limit in a sweep, seconds
TIMEOUT_S = 900
#: steps under torch.profiler with ``profile``
PROFILE_STEPS = 2
