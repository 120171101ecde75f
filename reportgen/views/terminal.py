"""Print one estimate as a breakdown that reads at a glance."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from reportgen.estimate.run import NOT_COUNTED, PHASE_LABELS, RUN_ONLY_PHASES
from reportgen.format import GIB, TERM_LABELS, demand_note, gib, money, pct, rate, seconds


#: recipe grpo's terms (``estimate/grpo.py``); not in ``TERM_LABELS``, whose keys are the site's CSV columns
GRPO_LABELS = {"ref_model": "reference model (beta > 0)", "grpo_buffers": "buffered generation batch",
               "kv_cache": "KV cache (generation)", "generation_transient": "generation transients",
               "scoring_transient": "scoring forward (no grad)", "vllm_pool": "vLLM pool (colocated)"}
VERDICT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red"}


def print_estimate(est, model, gpu, console: Console | None = None, footer: str = "estimate only",
                   host_memory: int | None = None) -> None:
    """The estimate as tables; ``footer`` says whether this setup was measured (``measured.footer``);
    ``host_memory``: the node's host RAM in bytes, to judge the run's host peak against."""
    console = console or Console()
    mem, t = est.memory, est.time
    console.print(f"[bold]{escape(model.name)}[/] on [bold]{gpu.name}[/] ({gpu.memory_bytes / GIB:.1f} GiB): "
                  f"{est.setup.short()}", highlight=False)
    console.print(f"parameters {est.params_total:,}, trainable {est.params_trainable:,} "
                  f"({100 * est.params_trainable / est.params_total:.2f}%)", highlight=False)
    if getattr(model, "revision", None):
        console.print(f"config.json of {escape(model.hf_repo)} at commit {escape(model.revision)} "
                      "(Hugging Face Hub)", highlight=False)

    table = Table(title="memory on one GPU (GiB = 2^30 bytes)", title_justify="left")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    biggest = max(mem.terms.values()) or 1
    for key, value in mem.terms.items():
        if value == 0:
            continue
        bar = "█" * max(1, round(24 * value / biggest))
        table.add_row(TERM_LABELS.get(key) or GRPO_LABELS.get(key, key), gib(value), f"[cyan]{bar}[/]")
    table.add_section()
    table.add_row("[bold]peak allocated[/] (torch.cuda.max_memory_allocated)", gib(mem.peak_allocated),
                  f"at {mem.peak_phase}")
    table.add_row("[bold]peak reserved[/] (torch.cuda.max_memory_reserved)", gib(mem.peak_reserved), "")
    v = est.judgement
    style = VERDICT_STYLE[v.kind]
    table.add_row("[bold]device total[/] (nvidia-smi)", gib(mem.device_total), "")
    if mem.cache_released:
        table.add_row("  cached blocks released to fit", gib(mem.cache_released),
                      "reserved would pass the card without it")
    if v.demand != mem.device_total:
        table.add_row("  asked of the card", gib(v.demand), demand_note(mem.as_dict()))
    if v.range is not None:
        table.add_row("  expected range (error band)", f"{gib(v.range[0])}-{gib(v.range[1])}",
                      f"{100 * v.band.lo:+.0f}% to {100 * v.band.hi:+.0f}%, from {v.band.n} comparisons")
    table.add_row(f"[bold {style}]verdict[/]", f"[{style}]{v.kind}[/]",
                  f"margin {v.margin / GIB:+.2f} GiB of {gpu.memory_bytes / GIB:.1f}")
    if mem.host_ram:
        table.add_row("host RAM (offload)", gib(mem.host_ram), "")
    console.print(table)

    if est.run is not None:
        console.print(_run_table(est.run, v.phase, host_memory))
    console.print(_time_table(t, gpu, v.kind))
    if est.grpo is not None:
        _print_grpo(est, console, style)
    mb = "none fits" if est.max_batch is None else str(est.max_batch)  # the calculator's words
    ms = "none fits" if est.max_seq is None else f"{est.max_seq:,}"
    console.print(f"[{style}]{escape(v.text())}[/]", highlight=False)
    if host_memory and est.run is not None and est.run.host_peak > host_memory:
        console.print(f"[red]the host does not fit: the run needs {gib(est.run.host_peak)} GiB of host RAM at "
                      f"{PHASE_LABELS[est.run.host_phase]}, more than the {gib(host_memory)} GiB of --host-memory[/]",
                      highlight=False)
    if est.grpo is None:
        console.print(f"largest micro-batch that fits at seq {est.setup.seq:,}: [bold]{mb}[/]   "
                      f"longest sequence that fits at batch {est.setup.batch}: [bold]{ms}[/]", highlight=False)
    if v.kind == "does not fit":
        import shlex

        console.print(escape(f"what to turn on first, each step estimated: reportgen advise --model {shlex.quote(model.name)} "
                             f"--gpu {gpu.key} --seq {est.setup.seq}"), highlight=False)
    for note in est.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    console.print(f"[dim]{escape(footer)}[/]", highlight=False)

def _run_table(run, deciding: str, host_memory: int | None) -> Table:
    """The whole run's phases: what each asks of one GPU and of the node's host RAM."""
    rt = Table(title=f"the whole run: each phase's peak ({run.ranks_per_node} GPU process"
                     f"{'es' if run.ranks_per_node > 1 else ''} on the node)", title_justify="left")
    rt.add_column("phase")
    rt.add_column("GPU GiB", justify="right")
    rt.add_column("host RAM GiB", justify="right")
    rt.add_column("host RAM terms")
    for name, ph in run.phases.items():
        mark = " [bold](decides)[/]" if name == deciding and len(run.phases) > 1 else ""
        terms = ", ".join(f"{k.replace('_', ' ')} {gib(b)}" for k, b in ph.host_terms.items()) or "-"
        rt.add_row(PHASE_LABELS.get(name, name) + mark, gib(ph.gpu_demand), gib(ph.host), escape(terms))
    rt.add_section()
    peak = run.host_peak
    if host_memory:
        word = "fits" if peak <= host_memory else "does not fit"
        rt.add_row("host RAM", "", gib(peak), f"{word} in {gib(host_memory)} GiB (--host-memory): peak at "
                   f"{PHASE_LABELS[run.host_phase]}")
    rt.add_row("not counted", "", "", escape(NOT_COUNTED))
    return rt


def _print_grpo(est, console: Console, style: str) -> None:
    """Recipe grpo: device memory and seconds per phase, and the phases that decide each (``estimate/grpo.py``)."""
    g = est.grpo
    table = Table(title=f"GRPO phases: {g['generation_batch']} completions of {est.setup.max_completion_length:,} "
                  f"tokens after prompts of {g['prompt_length']:,}, generated by {est.setup.generation.value}",
                  title_justify="left")
    for col in ("phase", "device GiB (nvidia-smi)", "s per optimizer step"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    step_decides = est.judgement.phase not in RUN_ONLY_PHASES  # else the run's load, evaluation or save does
    for phase, secs in g["times"].items():
        mem = g["phases"].get(phase)
        mark = " [bold]<- decides the verdict[/]" if step_decides and phase == g["peak_phase"] else ""
        slow = " [bold]<- dominates the time[/]" if phase == g["time_phase"] else ""
        table.add_row(phase + mark + slow, "-" if mem is None else gib(mem), seconds(secs) if secs else "-")
    console.print(table)
    n = g.get("max_num_generations")
    c = g.get("max_completion_length")
    decided = (f"verdict decided by the {g['peak_phase']} phase" if step_decides else
               f"the step's peak is its {g['peak_phase']} phase, the verdict the run's "
               f"{PHASE_LABELS[est.judgement.phase]}")
    console.print(f"[{style}]{decided}[/]; the step's time is mostly "
                  f"{g['time_phase'] or '-'}; largest num_generations that fits: "
                  f"[bold]{'none fits' if n is None else n}[/]; longest completion that fits: "
                  f"[bold]{'none fits' if c is None else f'{c:,}'}[/]", highlight=False)
    if g.get("turn_down"):
        options = ", or ".join(f"--{x['field'].replace('_', '-')} {x['value']}" for x in g["turn_down"])
        console.print(f"to make it fit, turn down one of (each alone fits): {options}", highlight=False)


def _time_table(t, gpu, kind: str) -> Table:
    """The step time of an estimate, GPU and host, as a table (said to be hypothetical when it does not fit)."""
    basis = ("GEMM efficiency fitted to published tokens/s of consumer cards, the rest to H100 step times"
             if gpu.is_consumer else "constants fitted to H100 step times")
    if gpu.profile is not None:
        basis = ("H100-fitted constants scaled by your card's profile" if gpu.profile.device == "cuda"
                 else "your host's profile; the card's rates from its datasheet")
    ran = " if it fit (it does not: the step would run out of memory)" if kind == "does not fit" else ""
    tt = Table(title=f"time{ran} (kernels priced on the GPU and on the host, overlapped; {basis})", title_justify="left")
    tt.add_column("")
    tt.add_column("", justify="right")
    tt.add_row("step time", seconds(t.step_s))
    tt.add_row("tokens/s (all GPUs)", rate(t.tokens_per_s))
    tt.add_row("MFU (PaLM model FLOPs)", pct(t.mfu))
    tt.add_row("HFU (FLOPs the kernels execute)", pct(t.hfu))
    tt.add_row("bound by", t.bound or "-")
    if t.parts:
        p = t.parts
        work = t.work or {}
        kernels = sum(work.get(ph, {}).get("kernels", 0) for ph in ("forward", "backward")) * work.get("accum", 1) + \
            work.get("optimizer", {}).get("kernels", 0)
        tt.add_row("  GPU: GEMMs / memory-bound / launches",
                   f"{seconds(p['compute'])} / {seconds(p['memory'])} / {seconds(p['launch'])}")
        tt.add_row(f"  host: dispatch, {kernels:,.0f} kernels (exposed)",
                   f"{seconds(p['host'])} ({seconds(p['host_exposed'])})")
    tt.add_row("model FLOPs per token", f"{t.model_flops_per_token / 1e9:.1f} GFLOP")
    tt.add_row("hardware FLOPs per token", f"{t.hardware_flops_per_token / 1e9:.1f} GFLOP")
    tt.add_row(f"{t.train_tokens / 1e6:,.0f}M tokens", "-" if t.train_hours is None else
               f"{t.train_hours:.1f} h, {money(t.train_dollars)}")
    return tt


def print_lengths(r: dict, setup, console: Console | None = None) -> None:
    """What a dataset's lengths mean for the setup (``estimate/lengths.dataset_report``), with what to do."""
    console = console or Console()
    console.print(f"dataset: {r['samples']:,} samples, longest {r['longest']:,} tokens, mean {r['mean']:,.0f} after "
                  f"the cut at {r['cap']:,} ({100 * r['cut_share']:.1f}% of samples are cut)", highlight=False)
    console.print(f"padding {setup.padding.value}: a micro-batch of {setup.batch} is {r['padded_length']:,.0f} tokens "
                  f"long on average, {100 * r['padding_waste']:.0f}% of the computed tokens are padding", highlight=False)
    waste = r["waste_by_padding"]
    if setup.padding.value != "packed" and r["padding_waste"] > 0.05:
        console.print(f"[yellow]packing[/] (--padding packed) would cut the padding waste from "
                      f"{100 * r['padding_waste']:.0f}% to 0%" + (f" (padding to the longest: {100 * waste['longest']:.0f}%)"
                                                                 if setup.padding.value == "max" else ""), highlight=False)
    if "grouped" in waste and r["padding_waste"] - waste["grouped"] > 0.05:
        console.print(f"[yellow]grouping by length[/] (group_by_length: true, transformers' LengthGroupedSampler: "
                      f"mega-batches of up to 50 micro-batches sorted by length) would cut the padding waste from "
                      f"{100 * r['padding_waste']:.0f}% to {100 * waste['grouped']:.0f}%, and puts the longest "
                      "micro-batch first, so a run that would run out of memory does so at its first step",
                      highlight=False)
    growth = r.get("reserved_growth")
    if growth:
        (first, a), (later, b) = list(growth.items())
        console.print(f"reserved memory follows the longest micro-batch seen so far (the caching allocator keeps its "
                      f"blocks): {gib(a['peak_reserved'])} GiB at the first step (its longest sample "
                      f"{a['longest']:,} tokens), {gib(b['peak_reserved'])} GiB by step {later} ({b['longest']:,} "
                      "tokens, median cases); steps of many lengths near the longest add cached blocks on top, which "
                      "reportgen trace --lengths replays", highlight=False)
    if r["p99_5"] < r["cap"]:
        console.print(f"cutting at {r['p99_5']:,} tokens (--seq {r['p99_5']}) would cut "
                      f"{100 * r['p99_5_cut_share']:.1f}% of the samples; memory follows the cut", highlight=False)
