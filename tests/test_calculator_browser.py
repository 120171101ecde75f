"""The calculator page in headless Chromium: it runs reportgen's own estimator under Pyodide, served
from the built site alone, and shows what ``reportgen estimate --format json`` prints.

For several setups (full, full with checkpointing across 8 GPUs with FSDP, LoRA, QLoRA on a card
with ``--gpu-memory``, a pasted config.json) the test sets the form as a reader would (values and
input events), then checks that the page's command line is the expected ``reportgen estimate``
command, that the JSON the page shows is byte for byte the CLI's output for that command (run in a
subprocess), and that every number the page shows is that JSON formatted by
``reportgen.browser.view``. It also checks that no request leaves 127.0.0.1 (other hosts are
unreachable and every request is logged), times the first answer and the recomputations, restores
a setup from its link, shows a malformed pasted config's error, and checks that a later visit starts
from the snapshot of the started estimator that the first one stored, with the same answers.

Needs Chromium, chromedriver, selenium and the Pyodide runtime (``reportgen.report.pyodide``:
downloaded once from the npm registry into ~/.cache/reportgen); skipped without them. Timings and
screenshots are printed with ``-s``; ``REPORTGEN_SHOTS=DIR`` keeps the screenshots in DIR."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reportgen.browser import view
from reportgen.report import pyodide
from tests import chromium

ROOT = Path(__file__).resolve().parents[1]
MISTRAL = (ROOT / "reportgen" / "published" / "configs" / "mistral-7b-v0.1.json").read_text()
TRL_QLORA = (Path(__file__).parent / "fixtures" / "configs" / "trl_qlora.yaml").read_text()
#: LLaMA-Factory's LoRA SFT config and its examples/accelerate/fsdp_config.yaml as shipped (tests/test_calculator.py)
LF_LORA = "".join(line for line in (Path(__file__).parent / "fixtures" / "configs" / "llamafactory_qlora.yaml")
                  .read_text().splitlines(keepends=True) if not line.startswith("quantization_"))
LF_FSDP = (ROOT / "reportgen" / "configs" / "vendored" / "llamafactory" / "examples" / "accelerate"
           / "fsdp_config.yaml").read_text()

pytestmark = [pytest.mark.browser, chromium.needs_chromium]

#: name -> (form controls to set, the command line the page must show)
SETUPS = {
    "full": ({}, "reportgen estimate --model llama-3.2-1b --gpu rtx-4090"),
    "fsdp-ckpt": ({"model": "llama-3.1-70b", "gpu": "h100-sxm", "setup.grad_ckpt": True, "setup.batch": "2",
                   "setup.gpus": "8", "setup.sharding": "fsdp"},
                  "reportgen estimate --model llama-3.1-70b --gpu h100-sxm --grad-ckpt --batch 2 --gpus 8 "
                  "--sharding fsdp"),
    "lora": ({"model": "llama-3.1-8b", "gpu": "a100-80gb", "setup.method": "lora", "setup.lora_rank": "64",
              "setup.lora_targets": "qv", "setup.batch": "4", "setup.seq": "1024", "setup.accum": "4",
              "setup.padding": "packed"},
             "reportgen estimate --model llama-3.1-8b --gpu a100-80gb --method lora --lora-rank 64 --lora-targets qv "
             "--batch 4 --seq 1024 --accum 4 --padding packed"),
    "qlora-48gib": ({"model": "llama-3.1-8b", "gpu": "rtx-4090", "gpu_memory": "48GiB", "setup.method": "qlora",
                     "setup.double_quant": True, "setup.grad_ckpt": True, "setup.batch": "2"},
                    "reportgen estimate --model llama-3.1-8b --gpu rtx-4090 --gpu-memory 48GiB --method qlora "
                    "--double-quant --grad-ckpt --batch 2"),
    "pasted": ({"paste": True, "config": MISTRAL, "gpu": "t4", "setup.method": "qlora", "setup.grad_ckpt": True,
                "setup.seq": "1024", "train_tokens": "2e7"},
               "reportgen estimate --model config.json --gpu t4 --method qlora --grad-ckpt --seq 1024 "
               "--train-tokens 2e7"),
    # a pasted TRL config: its model and setup (the form's method is not sent)
    "trl": ({"paste_train": True, "train_config": TRL_QLORA, "gpu": "rtx-4090", "setup.method": "full"},
            "reportgen estimate --gpu rtx-4090 --from train.yaml"),
}
BAD_CONFIG = '{"model_type": "llama", "hidden_size": 4096,,}'

#: sets form controls by name (the rest back to their defaults, unless keep), then fires the
#: events typing would; resolves when the page has shown the result of the form as set (under load
#: the page was still computing the previous form's second run when the next form was set, and the
#: first new result shown was that one, once, in a fresh-clone run of the suite)
SET_FORM = """
const [values, keep, done] = arguments;
const root = document.getElementById('rg-calc'), form = root.querySelector('form');
const before = root.dataset.seq;
if (!keep) for (const e of form.elements) {
  if (!e.name) continue;
  if (e.type === 'checkbox') e.checked = e.dataset.default === '1';
  else if (e.name === 'config') e.value = '';
  else e.value = e.dataset.default;
}
for (const [name, value] of Object.entries(values)) {
  const e = form.elements[name];
  if (!e) { done('no control ' + name); return; }
  if (e.type === 'checkbox') e.checked = value; else e.value = value;
}
const t0 = performance.now();
const obs = new MutationObserver(() => {
  // a result shown, and it answers this form (not a computation that started before these values were set)
  if (root.dataset.seq === before || root.dataset.busy !== '0') return;
  obs.disconnect();
  requestAnimationFrame(() => setTimeout(() => done(performance.now() - t0)));  // painted
});
obs.observe(root, {attributes: true});
const last = form.elements[Object.keys(values).pop() || 'model'];
last.dispatchEvent(new Event('input', {bubbles: true}));
last.dispatchEvent(new Event('change', {bubbles: true}));
"""

READ_PAGE = """
const q = (s) => document.querySelector(s);
return {
  command: q('#rg-command').textContent,
  json: q('#rg-json').textContent,
  share: q('#rg-share').value,
  error: q('#rg-error').hidden ? null : q('#rg-error [data-key=error]').textContent,
  shown: Array.from(document.querySelectorAll('#rg-result [data-key]')).map((e) => [e.dataset.key, e.textContent]),
  form: Object.fromEntries(Array.from(q('#rg-calc form').elements).filter((e) => e.name)
    .map((e) => [e.name, e.type === 'checkbox' ? e.checked : e.value])),
};
"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".mjs": "text/javascript", ".wasm": "application/wasm", ".json": "application/json"}
    served: list[str] = []  # paths requested from the site

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.served.append(self.path)
        super().do_GET()


@pytest.fixture(scope="module")
def served_site(fixture_site_built):
    try:
        pyodide.runtime_files()
    except pyodide.RuntimeUnavailable as exc:
        pytest.skip(f"the calculator's Pyodide runtime is unavailable ({exc})")
    site, _ = fixture_site_built  # tests/conftest.py: the fixture sweeps built once per run
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()



def _driver(profile: Path):
    # no host but this machine resolves: the site must work offline
    driver = chromium.start(profile, flags=("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",),
                            logging={"browser": "ALL", "performance": "ALL"})
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = _driver(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ["REPORTGEN_SHOTS"]) if os.environ.get("REPORTGEN_SHOTS") else tmp_path_factory.mktemp("shots")
    d.mkdir(parents=True, exist_ok=True)
    print(f"\ncalculator screenshots: {d}")
    return d


def wait_for(fn, timeout: float = 60.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def first_answer(driver, url: str | None) -> float:
    """Open ``url`` (None: the page already opening) and wait for its first result; ms from
    navigation start (the page's own clock)."""
    if url is not None:
        driver.get("about:blank")
        driver.get(url)
    ms = wait_for(lambda: driver.execute_script(
        "const r = document.getElementById('rg-calc');"
        "if (document.getElementById('rg-status').classList.contains('rg-no')) return 'failed: ' + "
        "document.getElementById('rg-status').textContent;"
        "return r && r.dataset.firstAnswerMs"), what="the calculator's first answer")
    assert not str(ms).startswith("failed"), ms
    return float(ms)


def snapshot_of(driver) -> str:
    """How the page's Python started (``data-snapshot``; calculator-worker.js)."""
    return driver.execute_script("return document.getElementById('rg-calc').dataset.snapshot")


def snapshot_stored(driver) -> str:
    """``data-snapshot`` once the first visit's snapshot is stored (or refused)."""
    return wait_for(lambda: (said := snapshot_of(driver)) not in (None, "storing") and said, what="the snapshot stored")


def snapshot_keys(driver) -> list[str]:
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "caches.open('reportgen-calculator').then((c) => c.keys()).then((ks) => done(ks.map((k) => k.url)));")


def on_calculator(driver, site: str) -> None:
    """The calculator page, answered: reused when the browser is already on it (the tests that set
    the form reset every control first, so they need no fresh page), opened afresh otherwise. The
    tests of what a page load does (the default view, a link) open it themselves."""
    url = site + "calculator/"
    if driver.current_url.split("#")[0] == url and driver.execute_script(
            "const r = document.getElementById('rg-calc'); return !!(r && r.dataset.firstAnswerMs)"):
        return
    first_answer(driver, url)


def requests_of(driver) -> list[str]:
    """Every URL the browser requested since the last call (DevTools' Network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def screenshot(driver, path: Path) -> None:
    height = driver.execute_script("return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
    driver.set_window_size(1400, min(height + 200, 6000))  # the window is taller than its viewport
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)


def cli(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command --format json`` in a fresh process (the reader's machine), from ``cwd``."""
    args = shlex.split(command)
    assert args[:2] == ["reportgen", "estimate"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "reportgen", *args[1:], "--format", "json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def expected_shown(cli_json: str) -> list[list[str]]:
    v = view(json.loads(cli_json))
    rows = [["title", v["title"]], ["params", v["params"]], ["verdict", v["verdict"]]]
    rows += [[r["key"], r["value"]] for s in v["sections"] for r in s["rows"]]
    return rows + [["note", n] for n in v["notes"]]


# ----- the tests ---------------------------------------------------------------------------------
@pytest.mark.timing  # its 5 s bound is a wall-clock time: measured alone, after the parallel run
def test_first_answer_comes_from_this_site_alone(served_site, tmp_path_factory, shots):
    """A reader's first visit (empty cache) and later visits: the time to the first answer, and
    every request the page makes goes to the site."""
    url = served_site + "calculator/"
    cold, warm = [], []
    for visit in range(2):  # each in a fresh profile: nothing cached
        driver = _driver(tmp_path_factory.mktemp("fresh-profile"))
        try:
            driver.get("about:blank")
            driver.get(url)
            if visit:
                screenshot(driver, shots / "calculator-loading.png")  # before the runtime is up
            cold.append(first_answer(driver, None))
            steps = driver.execute_script("return document.getElementById('rg-calc').dataset.timings")
            assert snapshot_stored(driver) == "made"
            for _ in range(3):
                warm.append(first_answer(driver, url))
                assert snapshot_of(driver) == "restored"  # not a slow start that happens to pass the bound
            warm_steps = driver.execute_script("return document.getElementById('rg-calc').dataset.timings")
            urls = requests_of(driver)  # the page's (DevTools)
            entries = driver.execute_script(  # the page's and its worker's (resource timing)
                "const r = document.getElementById('rg-calc');"
                "return performance.getEntriesByType('resource').map(e => e.name)"
                ".concat(JSON.parse(r.dataset.workerRequests))")
            severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        finally:
            driver.quit()
        assert not severe, severe
        # network requests (chrome://, data:, blob: never leave the browser)
        outside = [u for u in urls + entries
                   if u.split(":")[0] in ("http", "https", "ws", "wss", "ftp") and not u.startswith(served_site)]
        assert not outside, f"requests that leave the site: {outside}"
        assert any(u.endswith("/calculator/pyodide-314.0.7/pyodide.asm.wasm") for u in entries)
    served = set(_Handler.served)
    assert "/calculator/pyodide-314.0.7/pyodide.asm.wasm" in served  # by the page's worker
    assert any(p.startswith("/calculator/estimator-") for p in served)
    print(f"\nfirst answer, ms from navigation start: first visit {cold}, later visits {warm} "
          f"(median {statistics.median(warm):.0f}); steps of the last first visit: {steps}, "
          f"of the last later visit: {warm_steps}")
    # a later visit answers within 5 s. Starting Python afresh took 4.4-5.7 s here and missed it on
    # the CI machine (best of six 5.43 s, stop 26); restoring the snapshot takes 1.3-2.0 s here
    assert statistics.median(warm) <= 5000, warm
    assert min(cold) <= 15000, cold  # a first visit also downloads and compiles 13 MB


def test_a_later_visit_restores_the_started_estimator(served_site, tmp_path_factory):
    """A later visit starts from the snapshot the first one stored (calculator-worker.js) and answers
    every setup exactly as the first visit's freshly started Python did. A stored snapshot that is not
    whole is refused: that visit and the later ones start afresh and answer alike, and none is made
    again for this version. A stored entry replaces those of older versions of the calculator."""
    url = served_site + "calculator/"
    driver = _driver(tmp_path_factory.mktemp("snapshot-profile"))

    def answers() -> dict[str, dict]:
        out = {}
        for name, (values, _) in SETUPS.items():
            driver.execute_async_script(SET_FORM, values, False)
            page = driver.execute_script(READ_PAGE)
            out[name] = {k: page[k] for k in ("command", "json", "shown", "error")}
        return out

    try:
        first_answer(driver, url)
        fresh = answers()
        assert snapshot_stored(driver) == "made"
        [key] = snapshot_keys(driver)
        bundle = driver.execute_script("return document.getElementById('rg-calc').dataset.bundle").split("/")[-1]
        assert key.startswith(served_site + "calculator/pyodide-314.0.7/snapshot-") and key.endswith("/" + bundle)

        first_answer(driver, url)
        assert snapshot_of(driver) == "restored"
        assert answers() == fresh  # pasted configs too: their files are written after the restore

        # the stored snapshot cut short (its recorded length kept), and an older calculator's beside it
        old = served_site + "calculator/pyodide-0.0.0/snapshot-1/estimator-000000000000.json"
        written = driver.execute_async_script("""
            const [key, old, done] = arguments;
            caches.open('reportgen-calculator').then(async (c) => {
              const r = await c.match(key), bytes = new Uint8Array(await r.arrayBuffer());
              const length = r.headers.get('X-Reportgen-Snapshot-Bytes');
              await c.put(key, new Response(bytes.slice(0, 4096), {headers: {'X-Reportgen-Snapshot-Bytes': length}}));
              await c.put(old, new Response('x'));
              done(length);
            });""", key, old)
        why = f"the stored snapshot is 4096 bytes, not the {written} written"
        first_answer(driver, url)
        assert snapshot_of(driver) == f"restore failed: {why}; none: not made again for this version"
        assert driver.execute_script(READ_PAGE)["json"] == fresh["full"]["json"]
        assert snapshot_keys(driver) == [key]  # the older one is gone
        first_answer(driver, url)
        assert snapshot_of(driver) == f"none: a snapshot of this version was refused on an earlier visit ({why})"
        assert answers() == fresh
    finally:
        driver.quit()


def test_the_default_view_answers_one_way(served_site, browser, shots):
    """Issue 19: the default view (llama-3.2-1b, full fine-tuning, RTX 4090) said "tight in 24.0 GiB" and,
    below, "largest micro-batch at seq 2,048: none fits" and "longest sequence at batch 1: 1,920" (past
    what the same verdict allows). As a reader reads it: the verdict with its margin, and reverse answers
    that agree with it (a fitting setup's batch and sequence are within them, a tight one's are not)."""
    first_answer(browser, served_site + "calculator/")
    page = browser.execute_script(READ_PAGE)
    shown = dict(page["shown"])
    verdict, batch, seq = shown["verdict"], int(page["form"]["setup.batch"]), int(page["form"]["setup.seq"])
    data = json.loads(page["json"])
    assert verdict == data["verdict"] and shown["verdict"] in ("fits", "tight", "does not fit")
    text = browser.execute_script("return document.querySelector('.rg-calc-verdict').textContent")
    assert text.startswith(verdict + ":") and " GiB" in text  # the margin, in words
    assert f"{data['margin'] / 2**30:+.2f} GiB" in browser.execute_script(
        "return document.getElementById('rg-result').textContent")

    def number(key):
        value = shown[key]
        return None if value.startswith("none fits") else int(value.replace(",", ""))

    largest, longest = number("max_batch"), number("max_seq")
    if verdict == "fits":
        assert largest is not None and largest >= batch and longest is not None and longest >= seq
    else:
        assert largest is None or largest < batch, shown["max_batch"]
        assert longest is None or longest < seq, shown["max_seq"]
        assert shown["max_batch"].startswith("none fits") or largest < batch
    screenshot(browser, shots / "calculator-default.png")


def test_numbers_equal_the_cli_for_every_setup(served_site, browser, tmp_path, shots):
    on_calculator(browser, served_site)
    (tmp_path / "config.json").write_text(MISTRAL)
    (tmp_path / "train.yaml").write_text(TRL_QLORA)
    reverse = 0
    for name, (values, command) in SETUPS.items():
        ms = browser.execute_async_script(SET_FORM, values, False)
        assert isinstance(ms, (int, float)), ms
        page = browser.execute_script(READ_PAGE)
        assert page["error"] is None, (name, page["error"])
        assert page["command"] == command, name
        proc = cli(command, tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert page["json"] == proc.stdout, name  # every field, byte for byte (estimator hash too)
        assert page["shown"] == expected_shown(proc.stdout), name  # every number shown, formatted alike
        data = json.loads(proc.stdout)
        reverse += data["max_batch"] is not None and data["max_batch"] > 1 and data["max_seq"] is not None
        if name == "qlora-48gib":
            assert data["gpu"] == "rtx-4090@48GiB" and data["capacity"] == 48 * 2**30
            screenshot(browser, shots / "calculator-result.png")
    assert reverse >= 2  # largest batch and longest sequence are real answers, not "none fits"


def test_a_pasted_training_config_lists_its_keys(served_site, browser):
    on_calculator(browser, served_site)
    browser.execute_async_script(SET_FORM, SETUPS["trl"][0], False)
    lines = browser.execute_script("return Array.from(document.querySelectorAll('#rg-from li')).map(e => e.textContent)")
    assert lines[0] == "from train.yaml (TRL 1.16.0 keys): model qwen2.5-7b"
    assert browser.execute_script("return document.getElementById('rg-method').disabled")  # the file's setup


def test_a_pasted_launch_file_runs_on_its_gpus_and_sharding(served_site, browser, shots):
    """LLaMA-Factory's lora config launched with examples/accelerate/fsdp_config.yaml: 2 GPUs, FSDP; the launch
    box shows only beside a training config, and the link keeps the launch file."""
    on_calculator(browser, served_site)
    browser.execute_async_script(SET_FORM, {"paste_launch": True, "launch_config": LF_FSDP}, False)
    hidden = "return [document.getElementById('rg-launch-check').hidden, document.getElementById('rg-launch-box').hidden]"
    assert browser.execute_script(hidden) == [True, True]  # no training config: no launch file
    assert "--launch" not in browser.execute_script("return document.getElementById('rg-command').textContent")
    browser.execute_async_script(SET_FORM, {"gpu": "h100-sxm", "paste_train": True, "train_config": LF_LORA,
                                            "paste_launch": True, "launch_config": LF_FSDP}, False)
    page = browser.execute_script(READ_PAGE)
    assert page["command"] == "reportgen estimate --gpu h100-sxm --from train.yaml --launch launch.yaml", page["error"]
    setup = json.loads(page["json"])["setup"]
    assert (setup["gpus"], setup["sharding"], setup["precision"]) == (2, "fsdp", "bf16-mixed")
    assert browser.execute_script(hidden) == [False, False]
    assert not browser.execute_script("return document.getElementById('rg-launch-note').hidden")
    assert browser.execute_script("return document.getElementById('rg-gpus').disabled")  # the launch file's
    shown = "return [document.getElementById('rg-gpus').value, document.getElementById('rg-sharding').value]"
    assert browser.execute_script(shown) == ["2", "fsdp"]  # the greyed fields show the launch file's values
    lines = browser.execute_script("return Array.from(document.querySelectorAll('#rg-from li')).map(e => e.textContent)")
    assert "launch launch.yaml (accelerate 1.15.0 config keys)" in lines
    assert "launch=" in page["share"]
    screenshot(browser, shots / "calculator-launch.png")


def test_a_pasted_gpu_profile_is_used_and_named(served_site, browser):
    text = (Path(__file__).resolve().parents[1] / "data" / "gpu-profiles" / "h100-sxm.20261127T203244Z.yaml").read_text()
    on_calculator(browser, served_site)
    browser.execute_async_script(SET_FORM, {"paste_profile": True, "profile_text": text, "gpu": "h100-sxm"}, False)
    assert browser.execute_script("return document.getElementById('rg-command').textContent") == (
        "reportgen estimate --model llama-3.2-1b --gpu h100-sxm --gpu-profile gpu-profile.yaml")
    notes = browser.execute_script("return Array.from(document.querySelectorAll('[data-key=note]')).map(e => e.textContent)")
    assert any("your card's profile" in n for n in notes)
    assert not browser.execute_script("return document.getElementById('rg-profile-note').hidden")


def test_recomputation_is_fast(served_site, browser):
    on_calculator(browser, served_site)
    browser.execute_async_script(SET_FORM, SETUPS["qlora-48gib"][0], False)
    times = []
    for batch in range(1, 13):
        times.append(browser.execute_async_script(SET_FORM, {"setup.batch": str(batch)}, True))
    for seq in ("1024", "4096", "8192"):
        times.append(browser.execute_async_script(SET_FORM, {"setup.seq": seq}, True))
    for method in ("lora", "full", "qlora"):
        times.append(browser.execute_async_script(SET_FORM, {"setup.method": method}, True))
    python = float(browser.execute_script("return document.getElementById('rg-calc').dataset.pythonMs"))
    print(f"\nrecompute, change to painted result: median {statistics.median(times):.0f} ms, max {max(times):.0f} ms "
          f"over {len(times)} changes (last Python call {python:.0f} ms)")
    assert statistics.median(times) <= 300, times


def test_the_link_restores_the_setup(served_site, browser):
    on_calculator(browser, served_site)
    for name in ("qlora-48gib", "pasted"):
        browser.execute_async_script(SET_FORM, SETUPS[name][0], False)
        before = browser.execute_script(READ_PAGE)
        assert before["share"].startswith(served_site + "calculator/#")
        first_answer(browser, before["share"])  # a fresh page load from the link
        after = browser.execute_script(READ_PAGE)
        assert after["form"] == before["form"], name
        assert after["command"] == before["command"] == SETUPS[name][1]
        assert after["json"] == before["json"] and after["shown"] == before["shown"]


def test_a_link_with_values_the_page_lacks_names_them(served_site, browser):
    """Issue 20: a link with a model or method the page does not offer showed empty fields (and the
    estimate an empty model name). The fields keep their defaults and a note names the link's values."""
    first_answer(browser, served_site + "calculator/#model=llama-9b&method=ful&batch=4")
    page = browser.execute_script(READ_PAGE)
    assert page["form"]["model"] == "llama-3.2-1b" and page["form"]["setup.method"] == "full"
    assert page["form"]["setup.batch"] == "4"  # what the page offers is restored
    note = browser.execute_script("return document.getElementById('rg-link-note').textContent")
    assert 'model "llama-9b"' in note and 'method "ful"' in note and "defaults are shown" in note
    assert page["command"].startswith("reportgen estimate --model llama-3.2-1b --gpu rtx-4090") and page["error"] is None
    first_answer(browser, served_site + "calculator/#method=lora")  # a good link: no note
    assert browser.execute_script("return document.getElementById('rg-link-note').hidden")


def test_a_malformed_config_shows_the_cli_error(served_site, browser, tmp_path, shots):
    on_calculator(browser, served_site)
    browser.execute_async_script(SET_FORM, {"paste": True, "config": BAD_CONFIG, "gpu": "t4"}, False)
    page = browser.execute_script(READ_PAGE)
    assert page["command"] == "reportgen estimate --model config.json --gpu t4"
    (tmp_path / "config.json").write_text(BAD_CONFIG)
    proc = cli(page["command"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert page["error"] == proc.stderr.splitlines()[0][len("error: "):]
    assert "not valid JSON" in page["error"]
    screenshot(browser, shots / "calculator-error.png")
    browser.execute_script("document.body.setAttribute('data-md-color-scheme', 'slate')")
    screenshot(browser, shots / "calculator-error-dark.png")
    browser.execute_script("document.body.setAttribute('data-md-color-scheme', 'default')")
    # fixing the config brings the result back
    browser.execute_async_script(SET_FORM, {"config": MISTRAL}, True)
    assert browser.execute_script(READ_PAGE)["error"] is None


def test_a_hostile_pasted_config_is_an_error_and_the_page_recovers(served_site, browser):
    """A pasted TRL config is read in Pyodide by the same guarded reader as on the command line
    (yamlfile.py): nesting past the limit and an alias bomb (9**9 values from 90 written) are the
    CLI's errors, with no hang and no stack overflow of the page's runtime; a good config after them
    answers again."""
    on_calculator(browser, served_site)
    from tests.fixtures.hostile import DEEP_TRL, alias_bomb_trl

    for text, needle in ((DEEP_TRL, "nested too deeply to read"),
                         (alias_bomb_trl(), "more than 100,000 values once its aliases")):
        browser.execute_async_script(SET_FORM, {"paste_train": True, "train_config": text, "gpu": "t4"}, False)
        error = browser.execute_script(READ_PAGE)["error"]
        assert error is not None and needle in error and "Traceback" not in error, error
    browser.execute_async_script(SET_FORM, {"paste_train": True, "train_config": TRL_QLORA, "gpu": "rtx-4090"}, False)
    assert browser.execute_script(READ_PAGE)["error"] is None


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """The Hub's ``resolve`` URLs for the calculator's fetch (another origin, with the CORS header the
    Hub sends): one public config, one gated repository, 404 for the rest."""

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/acme/Tiny-Mistral/resolve/main/config.json":
            status, body = 200, MISTRAL.encode()
        elif self.path.startswith("/acme/Gated/"):
            status, body = 401, b"gated"
        else:
            status, body = 404, b"Entry not found"
        self.send_response(status)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


FETCH_HUB = """
const [hub, base, done] = arguments;
const root = document.getElementById('rg-calc'), form = root.querySelector('form');
root.dataset.hubBase = base;
const note = document.getElementById('rg-hub-note');
form.elements.hub.value = hub;
const before = root.dataset.seq;
document.getElementById('rg-hub-fetch').click();
const t0 = performance.now();
(function wait() {
  const settled = !note.textContent.startsWith('fetching') && note.textContent !== '';
  const answered = !note.textContent.includes('fetched from the Hub') || (root.dataset.seq !== before && root.dataset.busy === '0');
  if (settled && answered) done(note.textContent);
  else if (performance.now() - t0 > 30000) done('timeout: ' + note.textContent);
  else setTimeout(wait, 50);
})();
"""


def test_a_hub_id_fetches_its_config_and_says_why_when_it_cannot(served_site, browser, shots):
    """Issue 28: the calculator takes a Hub id. Its config.json is fetched by the browser (here from a
    stand-in for huggingface.co on another origin) only on the button, pasted, and estimated as a
    pasted config is; a gated repository, a missing one, a malformed id and an unreachable Hub each
    say what to do instead."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        on_calculator(browser, served_site)
        browser.execute_async_script(SET_FORM, {"gpu": "rtx-4090"}, False)
        note = browser.execute_async_script(FETCH_HUB, "acme/Tiny-Mistral", base)
        assert "config.json of acme/Tiny-Mistral fetched from the Hub" in note
        assert "reportgen estimate --model acme/Tiny-Mistral" in note
        fetched = browser.execute_script(READ_PAGE)
        assert fetched["command"].startswith("reportgen estimate --model config.json") and fetched["error"] is None
        screenshot(browser, shots / "calculator-hub.png")
        browser.execute_async_script(SET_FORM, {"paste": True, "config": MISTRAL, "gpu": "rtx-4090"}, False)
        pasted = browser.execute_script(READ_PAGE)
        assert fetched["json"] == pasted["json"]  # the same numbers as the config pasted by hand
        for hub, needle in (("acme/Gated", "is gated or private, and this page sends no token"),
                            ("acme/Nothing", "no repository acme/Nothing on the Hub"),
                            ("acme/Nothing@v9", 'has no revision "v9"'),
                            ("not a hub id", "is not a Hub id: write ORG/NAME")):
            assert needle in browser.execute_async_script(FETCH_HUB, hub, base), hub
    finally:
        server.shutdown()
        server.server_close()
    unreachable = browser.execute_async_script(FETCH_HUB, "acme/Tiny-Mistral", base)  # the server is gone
    assert "could not reach the Hub" in unreachable and "paste it below" in unreachable


class _SubPath(_Handler):
    """The site under /reportgen/, as GitHub Pages serves a project site; anything else is 404."""

    PREFIX = "/reportgen"

    def do_GET(self):
        if not self.path.startswith(self.PREFIX + "/"):
            self.send_error(404)
            return
        self.path = self.path[len(self.PREFIX):]
        super().do_GET()


def test_the_site_and_its_calculator_work_under_a_project_sub_path(fixture_site_built, served_site, browser):
    """Issue 31: GitHub Pages serves a project site under /<repository>/; every URL the calculator and
    its worker build is relative to the page, so the estimator answers there too, and the numbers are
    the ones served at the root."""
    site, _ = fixture_site_built
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_SubPath, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/reportgen/"
        first_answer(browser, base + "calculator/")
        under = browser.execute_script(READ_PAGE)
        assert under["error"] is None and under["command"].startswith("reportgen estimate")
        requests = json.loads(browser.execute_script("return document.getElementById('rg-calc').dataset.workerRequests"))
        assert requests and all(u.startswith(base) for u in requests), requests
        first_answer(browser, served_site + "calculator/")
        assert browser.execute_script(READ_PAGE)["json"] == under["json"]
    finally:
        server.shutdown()
        server.server_close()
