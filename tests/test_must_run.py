"""The skip guard of ``tests/conftest.py``: with ``REPORTGEN_REQUIRE_ALL`` set (CI), a must-run module
that skips, as a whole or one test, fails the run and is named; other modules may skip; without the
variable nothing changes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def _run(tmp_path: Path, files: dict[str, str], require: bool) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "REPORTGEN_REQUIRE_ALL"}
    if require:
        env["REPORTGEN_REQUIRE_ALL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True)


MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_module_here")\n\ndef test_x():\n    pass\n'
ONE_SKIP = 'import pytest\n\ndef test_ok():\n    pass\n\ndef test_s():\n    pytest.skip("no chromium")\n'
OTHER_SKIP = 'import pytest\n\ndef test_s():\n    pytest.skip("needs CUDA")\n'


def test_a_skipped_must_run_module_fails_the_run_when_required(tmp_path):
    files = {"test_trace_agreement.py": MODULE_SKIP, "test_site_browser.py": ONE_SKIP, "test_other.py": OTHER_SKIP}
    proc = _run(tmp_path, files, require=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "must-run tests skipped" in out
    assert "test_trace_agreement.py: could not import 'no_such_module_here'" in out
    assert "test_site_browser.py::test_s: no chromium" in out
    assert "test_other.py" not in out.split("must-run tests skipped")[1]  # CUDA tests may skip


def test_without_the_variable_skips_stay_skips(tmp_path):
    proc = _run(tmp_path, {"test_trace_agreement.py": MODULE_SKIP, "test_other.py": OTHER_SKIP}, require=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "must-run" not in proc.stdout
