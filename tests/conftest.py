"""Shared pytest configuration for the test suite.

Skips made loud: with ``REPORTGEN_REQUIRE_ALL=1`` (set by CI) a skipped test of a module in
``MUST_RUN``, or a must-run module skipped as a whole (a module-level ``importorskip``), fails the run
and the summary names each with its reason. These modules hold the checks that have no substitute
(the estimator against the traced step, the built site and the calculator in a browser, saved bytes
against autograd); where their dependencies are missing they skip, which is fine on a laptop and
wrong on CI. The CUDA tests are not listed: CI has no GPU.
"""

from __future__ import annotations

import os
import sys

# One intra-op thread for torch (and numpy's BLAS): the tests' models are tiny (hidden size 64), so a
# second thread only adds synchronisation, and on a loaded two-core machine OpenMP's spinning threads
# made each small matmul wait for a core (a DoRA saved-bytes test: 9 s with two threads, 1.3 s with
# one). Read once, when torch loads, so it is set before any test module imports it; subprocesses
# that tests start inherit it. A value already set in the environment wins.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# The suite never reaches the Hugging Face Hub (CI has no network to it): a model named by Hub id
# resolves from a fixture cache or fails at once instead of retrying for 20 s (reportgen/hub.py). Set
# before huggingface_hub is imported (it reads the variable once); the one network test unsets it for
# its own subprocess.
os.environ["HF_HUB_OFFLINE"] = "1"
if "torch" in sys.modules:  # a plugin loaded it first
    sys.modules["torch"].set_num_threads(1)

import pytest  # noqa: E402

#: test modules that must run in full where ``REPORTGEN_REQUIRE_ALL`` is set (CI)
MUST_RUN = ("test_trace_agreement.py", "test_site_browser.py", "test_calculator_browser.py", "test_calculator.py",
            "test_activations_vs_torch.py", "test_trace_saved.py", "test_trace_units.py", "test_work_vs_trace.py")
REQUIRE_ENV = "REPORTGEN_REQUIRE_ALL"

_skipped: dict[str, str] = {}  # node id -> reason


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes a minute or more; opt in with REPORTGEN_SLOW_TESTS=1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns xdist_group marks into node ids
def pytest_collection_modifyitems(config, items):
    """With pytest-xdist (``-n 2 --dist loadgroup``, the README's test command) the browser tests
    share one worker: one Chromium at a time, each module's browser and served site started once;
    so do the tests on the consumer sweep's walks."""
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.xdist_group("browser"))
        elif "consumer_walks" in item.fixturenames:
            # the consumer sweep's walks (9 s) and test_one_answer's estimates and pages (16 s) are
            # built once per worker: on one worker they are built once per run
            item.add_marker(pytest.mark.xdist_group("consumer"))


def _must_run(nodeid: str) -> bool:
    return nodeid.split("::")[0].rsplit("/", 1)[-1] in MUST_RUN


def _reason(report) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)
    return text.removeprefix("Skipped: ")


def pytest_collectreport(report):
    if report.skipped and _must_run(report.nodeid):
        _skipped[report.nodeid] = _reason(report)


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail") and _must_run(report.nodeid):
        _skipped[report.nodeid] = _reason(report)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(REQUIRE_ENV) and _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not (os.environ.get(REQUIRE_ENV) and _skipped):
        return
    terminalreporter.section(f"must-run tests skipped ({REQUIRE_ENV} is set)", red=True, bold=True)
    for nodeid, reason in sorted(_skipped.items()):
        terminalreporter.line(f"{nodeid}: {reason}")
    terminalreporter.line(f"these modules must run in full here: install what they need (README, Quick start) "
                          f"or unset {REQUIRE_ENV}")


@pytest.fixture(scope="session")
def fixture_site_built(tmp_path_factory):
    """The fixture sweeps' results with their FAKE measurements (``tests/fixtures/site_data.py``),
    rendered and built with ``mkdocs build --strict`` (``tests/test_render.py`` ``build_site``):
    ``(site folder, the ids build_results returned)``. Built once per run: it is the same site for
    every module that reads it (the strict build, provenance, the calculator in a browser), and
    each build takes a mkdocs run. Nothing may write into it."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    from tests.fixtures.site_data import build_results
    from tests.test_render import build_site

    work = tmp_path_factory.mktemp("fixture-site")
    ids = build_results(work / "results")
    return build_site(work / "results", work), ids


@pytest.fixture(scope="session")
def consumer_walks(tmp_path_factory):
    """``write_advice`` of ``sweeps/consumer.yaml`` (the README's sweep: 144 decision-tree walks),
    once per run. A walk depends on its (model, GPU, seq) alone, not on the results beside it, so a
    test copies the stored walks into its own results folder (``copy_into``) instead of walking
    again; ``stats`` is what ``write_advice`` returned."""
    import shutil
    from types import SimpleNamespace

    from reportgen.advise.store import ADVICE_DIR, write_advice
    from reportgen.sweep import load_sweep

    sweep = load_sweep(os.path.join(os.path.dirname(__file__), "..", "sweeps", "consumer.yaml"))
    walked = tmp_path_factory.mktemp("consumer-walks")
    stats = write_advice(sweep, walked)

    def copy_into(results) -> None:
        shutil.copytree(walked / sweep.name / ADVICE_DIR, results / sweep.name / ADVICE_DIR)

    return SimpleNamespace(sweep=sweep, stats=stats, copy_into=copy_into)
