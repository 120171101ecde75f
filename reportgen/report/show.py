"""``reportgen show CASE_ID``: one stored case, and the commands that recompute and remeasure it."""

from __future__ import annotations

import difflib
import json
import re
import shlex
from pathlib import Path

from reportgen import store
from reportgen.errors import UserError
from reportgen.fingerprint import estimator_hash
from reportgen.measure.timing import timing_note
from reportgen.views.measurement import profile_lines
from reportgen.provenance import provenance_of
from reportgen.results import UnreadableResult, current_id, read_json
from reportgen.setup import TrainingSetup
from reportgen.report import compare
from reportgen.report.rows import verdict_fields
from reportgen.traced_results import existing_path, find_traced, traced_time


#: measurement figures that are bytes (``reportgen.measure.protocol.MEASUREMENT_KEYS``)
BYTE_FIGURES = ("peak_allocated", "peak_reserved", "device_used", "device_total", "memory_after_load",
                "memory_after_load_reserved", "peak_allocated_at_failure")


def _is_traced(path: Path) -> bool:
    """A traced document (``results/<sweep>/traced/<id>.json``), not a case's result file: with
    ``--results results/<sweep>`` its ``traced`` folder sits where a sweep would."""
    try:
        return read_json(path).get("kind") == "traced"
    except UnreadableResult:
        return False


#: what a case id is made of (``results.case_id``): model slug, GPU key, method, hash
_ID_CHARS = re.compile(r"[A-Za-z0-9._@-]+")


def resolve_id(results_dir: Path, case_id: str) -> str:
    """The current id a typed id stands for: itself, or the one current id it begins (an id of 8
    hash digits, as files and pages printed before ids grew, or any abbreviation), found among the
    estimate, traced and measurement files under ``results_dir``. Several: an error listing them."""
    if not _ID_CHARS.fullmatch(case_id):
        raise UserError(f"{case_id!r} is not a case id", hint="ids look like llama-3.1-8b.rtx-4090.lora.1b40c065d32b "
                        "(the site's tables and `reportgen sweep` print them)")
    patterns = ("*/{}*.json", "*/traced/{}*.json", "*/measured/{}*.json", "traced/{}*.json", "measured/{}*.json")
    found: set[str] = set()
    for pattern in patterns:
        for path in results_dir.glob(pattern.format(case_id)):
            try:
                found.add(current_id(read_json(path)))
            except UnreadableResult:
                continue
    if case_id in found or len(found) != 1:
        if len(found) > 1 and case_id not in found:
            raise UserError(f"case id {case_id!r} is the beginning of {len(found)} cases",
                            hint="give more of it: " + ", ".join(sorted(found)[:5]))
        return case_id
    return found.pop()


def traced_anywhere(results_dir: Path, case_id: str) -> list[dict]:
    """Traced documents of the case in every sweep under ``results_dir``, or in ``results_dir``
    itself when it is one sweep's folder (``--results results/traced``)."""
    found = find_traced(results_dir, case_id)
    if not found and existing_path(results_dir, case_id):
        found = find_traced(results_dir.parent, case_id)
        found = [t for t in found if Path(t["path"]).parent.parent == results_dir]
    return found


def find_case(results_dir: Path, case_id: str, missing_ok: bool = False) -> list[tuple[str, dict]]:
    """``[(sweep, result)]`` of every sweep under ``results_dir`` that has the case (``missing_ok``:
    an empty list instead of the unknown-case error)."""
    found = []
    for path in sorted(results_dir.glob(f"*/{case_id}.json")):
        if _is_traced(path):
            continue
        try:
            found.append((path.parent.name, store.load_case(path.parent, case_id)))
        except UnreadableResult as exc:
            raise UserError(str(exc), hint=f"`reportgen sweep sweeps/{path.parent.name}.yaml` sets unusable files "
                            "aside and recomputes the estimate") from None
    if not found and not missing_ok:
        known = sorted({p.stem for p in results_dir.glob("*/*.json") if not _is_traced(p)})
        close = difflib.get_close_matches(case_id, known, n=5, cutoff=0.6)
        if not close:  # same model and GPU, any setup
            prefix = ".".join(case_id.split(".")[:2])
            close = [k for k in known if k.startswith(prefix)][:5]
        hint = ("close ids: " + ", ".join(close)) if close else (
            f"{len(known)} cases under {results_dir}" if known else f"no results under {results_dir}: run a sweep first")
        raise UserError(f"unknown case id {case_id!r}", hint=hint)
    return found


def setup_flags(setup: dict) -> list[str]:
    """The ``reportgen estimate`` flags that set this setup (defaults left out)."""
    from reportgen.flags import SETUP_FIELDS

    default = TrainingSetup.defaults_json()
    flags = []
    for key in SETUP_FIELDS:  # the CLI's order: method first
        value = setup.get(key, default[key])
        if value == default[key] and key != "method":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                flags.append(flag)
        else:
            flags += [flag, str(value)]
    # batch and seq always shown: they are what a reader changes first
    for key in ("batch", "seq"):
        if "--" + key not in flags:
            flags += ["--" + key, str(setup[key])]
    return flags


def commands(result: dict) -> dict[str, str]:
    case = result["case"]
    base = ["--model", case["model"], "--gpu", case["gpu"]] + setup_flags(case["setup"])
    tokens = ((result.get("estimate") or {}).get("time") or {}).get("train_tokens")
    est = ["reportgen", "estimate"] + base + (["--train-tokens", str(int(tokens))] if tokens else [])
    settings = (result.get("measurement") or {}).get("settings") or {}
    keys = ("warmup", "steps", "max_steps", "max_timed_s", "target_rel_ci")
    extra = [f for key in keys if settings.get(key) is not None for f in ("--" + key.replace("_", "-"), f"{settings[key]:g}")]
    if "steps" in settings and "max_steps" not in settings:  # measured before the adaptive rule: a fixed count
        extra += ["--max-steps", str(settings["steps"])]
    if settings.get("cap_to_gpu"):
        extra.append("--cap-to-gpu")
    if settings.get("profile"):
        extra += ["--profile", "--profile-steps", str(settings.get("profile_steps", 2))]
    return {"estimate": shlex.join(est),
            "measure": shlex.join(["reportgen", "measure"] + base + extra + ["--format", "json"]),
            "trace": shlex.join(["reportgen", "trace"] + base)}


def show_traced_only(results_dir: Path, traced: list[dict], out=print) -> None:
    """A case that only a trace stored (its sweep was traced but not estimated here)."""
    t = traced[0]
    case, sweep = t["case"], t.get("sweep") or Path(t["path"]).parent.parent.name
    setup = TrainingSetup.model_validate(case["setup"])
    out(f"case {t['id']}  (traced in sweep {sweep}; no estimate or measurement stored under {results_dir})")
    out(f"  model {case['model']}   GPU {case['gpu']}")
    out(f"  setup {setup.short()}")
    for doc in traced:
        _print_traced(doc, None, out=out)
    cmds = commands({"case": case})
    out("estimate it:")
    out(f"  {cmds['estimate']}")
    out(f"or estimate the whole sweep (then this command shows the estimate beside the trace):\n"
        f"  reportgen sweep sweeps/{sweep}.yaml")


def show(results_dir: Path, case_id: str, out=print) -> None:
    case_id = resolve_id(results_dir, case_id)
    found = find_case(results_dir, case_id, missing_ok=True)
    if not found:
        traced = traced_anywhere(results_dir, case_id)
        if traced:
            show_traced_only(results_dir, traced, out=out)
            return
        find_case(results_dir, case_id)  # raises the unknown-case error with close ids
    # one case, once: the result with a measurement first (issue 31: a case in two sweeps was printed
    # twice, "measurement: none" above the measurement, and its trace once per stored copy)
    found.sort(key=lambda sr: -len(sr[1].get("measurements") or []))
    sweep, r = found[0]
    case = r["case"]
    setup = TrainingSetup.model_validate(case["setup"])
    others = [s for s, _ in found[1:]]
    out(f"case {r['id']}  (sweep {sweep}" + (f"; also in {', '.join(others)}" if others else "")
        + f", sweep hash {r.get('sweep_hash')}, reportgen {r.get('reportgen_version')}, "
        f"estimator code {r.get('estimator_hash')})")
    out(f"  model {case['model']}   GPU {case['gpu']}")
    out(f"  setup {setup.short()}")
    out("  " + json.dumps(case["setup"], sort_keys=True))
    if r.get("in_sweep") is False:
        out(f"  (a measured case that sweeps/{sweep}.yaml no longer lists: still estimated, so that its "
            "measurement has an estimate of the same code to compare with)")
    if r.get("estimator_hash") != estimator_hash():
        out(f"  note: estimated by other estimator code ({r.get('estimator_hash')}) than this reportgen's "
            f"({estimator_hash()}): `reportgen sweep sweeps/{sweep}.yaml` recomputes it")
    out(f"status {r.get('status')}" + (f": {r['error']}" if r.get("error") else ""))
    est = r.get("estimate")
    if est:
        _print_estimate(est, case["gpu"], out)
    attempts = r.get("measurements") or []
    if not attempts:
        out("measurement: none (estimate only)")
    current = r.get("measurement")
    for m in attempts:
        _print_attempt(m, case["gpu"], current=m is current, many=len(attempts) > 1, out=out, est=est)
    traced = find_traced(results_dir, r["id"])
    if not traced:
        out("traced: none (`reportgen sweep sweeps/<sweep>.yaml --trace` stores one; the command below prints one)")
    else:
        _print_traced(traced[0], est, out=out)
        if len(traced) > 1:
            out("  the same case is also traced in: " + ", ".join(t["path"] for t in traced[1:]))
    cmds = commands(r)
    out("recompute the estimate:")
    out(f"  {cmds['estimate']}")
    out("trace it (no GPU):")
    out(f"  {cmds['trace']}")
    out("remeasure on a GPU:")
    out(f"  {cmds['measure']}")
    out(f"rerun the whole sweep:\n  reportgen sweep sweeps/{sweep}.yaml")


def _print_estimate(est: dict, gpu: str, out=print) -> None:
    from reportgen.format import TERM_LABELS, gib, money, pct, rate, seconds

    mem, t = est["memory"], est.get("time") or {}  # no step time: a card without a datasheet peak
    out("estimate (GiB = 2^30 bytes):")
    for key, label in TERM_LABELS.items():
        if mem.get(key):
            out(f"  {label:<42} {gib(mem[key]):>10}")
    out(f"  {'peak allocated':<42} {gib(mem['peak_allocated']):>10}   at {est.get('peak_phase')}")
    out(f"  {'peak reserved':<42} {gib(mem['peak_reserved']):>10}")
    out(f"  {'device total (nvidia-smi)':<42} {gib(mem['device_total']):>10}")
    out(f"  {verdict_fields(est, gpu)['verdict_text']}")
    if mem.get("host_ram"):
        out(f"  {'host RAM (offload)':<42} {gib(mem['host_ram']):>10}")
    _print_run(est.get("run"), out)
    out(f"  largest micro-batch that fits {est.get('max_batch') or '-'}   "
        f"longest sequence that fits {est.get('max_seq') or '-'}")
    out(f"  step {seconds(t.get('step_s'))}   tokens/s {rate(t.get('tokens_per_s'))}   MFU {pct(t.get('mfu'))}"
        f"   bound by {t.get('bound')}")
    if t.get("train_tokens"):
        hours = "-" if t.get("train_hours") is None else f"{t['train_hours']:.1f} h"
        out(f"  {t['train_tokens'] / 1e6:,.0f}M tokens: {hours}, {money(t.get('train_dollars'))}")
    for note in est.get("notes") or []:
        out(f"  note: {note}")


def _print_run(run, out=print) -> None:
    """The run's phases of a stored estimate (``estimate/run.py``): GPU and host RAM of each."""
    from reportgen.format import gib

    if not isinstance(run, dict) or not isinstance(run.get("phases"), dict):
        return  # stored before the run had phases
    for name in ("load", "train", "eval", "save"):
        ph = run["phases"].get(name)
        figures = [ph.get(k) for k in ("gpu_demand", "host")] if isinstance(ph, dict) else []
        if figures and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in figures):
            out(f"  {'run: ' + name:<42} {gib(figures[0]):>10}   GPU; host RAM {gib(figures[1])} GiB")


def _print_comparison(est: dict | None, m: dict, gpu: str, out=print) -> bool:
    """The estimate against this measurement (``report/compare.py``, the pages' numbers): each
    quantity the provenance rule lets count, with its relative error; why the speed is not compared;
    an out-of-memory run against the estimate's verdict. True when it said how the step was timed."""
    from reportgen.format import gib, rate

    c = compare.compare(est, m, gpu)
    if c is None or not c["counts"] or est is None:
        return False
    if c["status"] != "ok":
        if c["expected"] is not None:
            verdict = verdict_fields(est, gpu)["verdict_text"]
            at = f"; {gib(c['allocated_at_failure'])} GiB allocated when it failed" if c["allocated_at_failure"] else ""
            out(f"  out of memory: {'expected, the estimate foresaw it' if c['expected'] else 'NOT foreseen by the estimate'}"
                f" ({verdict}){at}")
        return False
    out("  estimate against this measurement (relative error = (estimate - measured) / measured):")
    for q, hit in c["quantities"].items():
        if q == "step_s":
            e, v = f"{hit['est']:.3f} s", f"{hit['meas']:.3f} s"
        else:
            e, v = f"{gib(hit['est'])} GiB", f"{gib(hit['meas'])} GiB"
        out(f"    {compare.LABELS[q]:<16} est {e:>11}   measured {v:>11}   {100 * hit['err']:+6.1f}%")
    tps = c["tokens_per_s"]
    if tps:
        out(f"    {'tokens/s':<16} est {rate(tps['est']):>11}   measured {rate(tps['meas']):>11}   {100 * tps['err']:+6.1f}%")
    t = c["timing"]
    if t:
        how = "a fixed count, measured before the harness timed until the median is stable" if t["fixed"] else \
            f"stopped: {t['stop_reason']}" if t["stop_reason"] else "adaptive count"
        out(f"    the measured step time is the median of {t['steps']} timed steps ({how}); fastest {t['min']:.3f} s, "
            f"slowest {t['max']:.3f} s: a spread of {100 * t['spread_rel']:.0f}% of the median")
    if c["speed_not_compared"]:
        out(f"    step time and tokens/s: not compared ({c['speed_not_compared']})")
    return t is not None


def _print_attempt(m: dict, gpu: str, current: bool, many: bool, out=print, est: dict | None = None) -> None:
    """One measuring attempt: what it is (the provenance rule), the estimate against it, its figures,
    error, cap, settings, environment and file."""
    from reportgen.format import gib

    prov = provenance_of(m)
    valid = prov.valid_quantities(gpu)
    tag = (" [shown on the site]" if current else " [earlier attempt]") if many else ""
    out(f"measurement{tag}: status {m.get('status')}" + (" (FAKE: test fixture)" if m.get("fake") else "")
        + (f", measured at {m['measured_at']}" if m.get("measured_at") else ""))
    out(f"  {prov.label(gpu)}")
    out("  compares with the estimate: " + (", ".join(valid) if valid else "nothing (not a measurement of this card)"))
    timed = _print_comparison(est, m, gpu, out=out)
    figures = m.get("measurement") if isinstance(m.get("measurement"), dict) else {}
    if figures.get("step_times_s") and not (timed and figures.get("steps_run") is None):
        out(f"  timing: {timing_note(figures)}")
    root = Path(m["path"]).parent.parent if m.get("path") else None  # the sweep directory
    for line in profile_lines(figures.get("profile"), root=root):
        out(f"  {line}")
    for key, value in sorted(figures.items()):
        if value is None or key == "profile":
            continue
        if key in BYTE_FIGURES:
            out(f"  {key:<42} {gib(value):>10} GiB")
        elif isinstance(value, float):
            out(f"  {key:<42} {value:>10.4g}")
        else:
            out(f"  {key:<42} {json.dumps(value, sort_keys=True)}")
    if m.get("error"):
        out(f"  error: {m['error'].strip().splitlines()[-1] if m['error'].strip() else ''}")
    for key in ("cap", "settings"):
        if m.get(key):
            out(f"  {key}: {json.dumps(m[key], sort_keys=True)}")
    env = m.get("environment")
    if env:
        out("  environment:")
        for key, value in sorted(env.items()):
            out(f"    {key}: {json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value}")
    if m.get("path"):
        out(f"  file: {m['path']}")


def _print_traced(t: dict, est: dict | None, out=print) -> None:
    """One traced file: its figures beside the estimate's, or why it is not shown on the site."""
    from reportgen.format import TERM_LABELS, gib

    out(f"traced (reportgen trace: the real step on the meta device, allocator simulated; not measured): "
        f"{t['path']}")
    if t.get("unreadable"):
        out(f"  unreadable: {t['stale']}")
        return
    if t.get("stale"):
        out(f"  STALE, not shown on the site: {t['stale']}; `reportgen sweep sweeps/{t.get('sweep')}.yaml --trace` "
            "traces it again")
    mem = t["memory"]
    emem = (est or {}).get("memory") or {}
    out("  alive at the traced peak (GiB = 2^30 bytes):")
    for key, label in TERM_LABELS.items():
        if mem.get(key):
            out(f"    {label:<40} {gib(mem[key]):>10}")
    out(f"  {'':<42} {'traced':>10} {'estimate':>10}")
    for key, label in (("peak_allocated", "peak allocated"), ("peak_reserved", "peak reserved (allocator simulation)"),
                       ("device_total", "device total (+ CUDA context constant)")):
        e = emem.get(key)
        gap = f"   gap {100 * (e - mem[key]) / mem[key]:+.1f}%" if e is not None and mem.get(key) else ""
        out(f"  {label:<42} {gib(mem[key]):>10} {gib(e) if e is not None else '-':>10}{gap}")
    time = traced_time(t) if not t.get("stale") else None
    if time is not None and time.step_s:
        e = ((est or {}).get("time") or {}).get("step_s")
        out(f"  {'step time, s (time model, traced kernels)':<42} {time.step_s:>10.3f} "
            f"{f'{e:.3f}' if e else '-':>10}")
    out(f"  peak at {t.get('peak_phase')} ({t.get('peak_op')}); {'fits' if t.get('fits') else 'does NOT fit'}")
    out(f"  trace code {t.get('trace_hash')}; " + ", ".join(f"{k} {v}" for k, v in sorted((t.get('environment') or {}).items())))
    out("  emulations: " + ", ".join(t.get("emulations") or []))
    for note in t.get("notes") or []:
        out(f"  note: {note}")
