"""Headless Chromium for the browser tests: where the browser and its driver are, and a driver
that starts reliably.

chromedriver exits at once (status 1) when the port selenium picked for it was taken between the
pick and its bind; with two test processes starting servers side by side that happened once on CI
(stop 25: all five calculator-browser tests errored at setup while the site-browser tests passed
in the same run). So a start that fails is retried on a fresh port, and the last failure carries
chromedriver's own log, so that a real breakage (a driver that does not match the browser, a
missing library) says what it is instead of "unexpectedly exited"."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

#: REPORTGEN_CHROMIUM / REPORTGEN_CHROMEDRIVER: another browser and its driver (CI's Chrome for Testing)
CHROMIUM = os.environ.get("REPORTGEN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("REPORTGEN_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"

#: the flags the machine's own probe starts Chromium with: no sandbox as root, and no background
#: connections (this machine's closed network refuses them, many at a time)
BASE_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--window-size=1400,1000")

needs_chromium = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)")

ATTEMPTS = 3


def start(profile: Path, flags: tuple[str, ...] = (), logging: dict | None = None):
    """A selenium driver for headless Chromium with its profile in ``profile``; tries ``ATTEMPTS``
    times (each on a port selenium picks afresh) and raises with chromedriver's log if none starts."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*BASE_FLAGS, f"--user-data-dir={profile}", *flags):
        options.add_argument(flag)
    if logging:
        options.set_capability("goog:loggingPrefs", logging)
    failures = []
    for attempt in range(1, ATTEMPTS + 1):
        log = profile.parent / f"{profile.name}-chromedriver-{attempt}.log"
        out = log.open("w")  # the driver's stdout and stderr, which say why it exited
        try:
            return webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=out), options=options)
        except WebDriverException as exc:
            out.close()
            text = log.read_text(errors="replace").strip()
            failures.append(f"attempt {attempt}: {exc.msg}\n{text[-2000:]}")
    raise RuntimeError(f"chromedriver {CHROMEDRIVER} did not start in {ATTEMPTS} attempts:\n" + "\n".join(failures))
