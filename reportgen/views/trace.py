"""Print one trace in the terminal, laid out like ``reportgen estimate``'s breakdown."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from reportgen.format import GIB, TERM_LABELS, gib

TOP_OPS = 8


def print_trace(tr, gpu, console: Console | None = None) -> None:
    console = console or Console()
    d = tr.as_dict()
    mem = d["memory"]
    console.print(f"[bold]{tr.model}[/] ({tr.model_type}) on [bold]{gpu.name}[/] ({gpu.memory_bytes / GIB:.1f} GiB): "
                  f"{tr.setup.short()}  [magenta]traced[/]", highlight=False)
    console.print(f"parameters {tr.params_total:,}, trainable {tr.params_trainable:,}", highlight=False)

    table = Table(title="alive at the traced peak (GiB = 2^30 bytes)", title_justify="left")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    terms = {k: mem[k] for k in tr.terms if k != "cuda_context"}
    biggest = max(terms.values()) or 1
    for key, value in terms.items():
        if value:
            bar = "█" * max(1, round(24 * value / biggest))
            table.add_row(TERM_LABELS.get(key, key), gib(value), f"[cyan]{bar}[/]")
    table.add_section()
    table.add_row("[bold]peak allocated[/] (simulated max_memory_allocated)", gib(mem["peak_allocated"]),
                  f"at {d['peak_phase']} ({d['peak_op']})")
    table.add_row("[bold]peak reserved[/] (caching-allocator replay)", gib(mem["peak_reserved"]), "")
    verdict = "[green]fits[/]" if tr.fits else "[red]does not fit[/]"
    table.add_row("[bold]device total[/] (+ CUDA context, a constant)", gib(mem["device_total"]),
                  f"{verdict} in {gpu.memory_bytes / GIB:.1f}")
    console.print(table)
    t = d.get("time")
    if t and t.get("step_s"):
        total = t["work"]
        k = sum(total[p]["kernels"] for p in ("forward", "backward")) * total["accum"] + total["optimizer"]["kernels"]
        console.print(f"step [bold]{t['step_s'] * 1e3:,.0f} ms[/] ({t['tokens_per_s']:,.0f} tokens/s, bound by "
                      f"{t['bound']}): the time model on the traced step's inventory, {k:,.0f} kernels launched",
                      highlight=False)

    timeline = Table(title="largest allocated bytes per phase of the traced step (after warm-up)", title_justify="left")
    timeline.add_column("phase")
    timeline.add_column("GiB", justify="right")
    for phase, value in d["timeline"].items():
        timeline.add_row(phase, gib(value))
    console.print(timeline)

    if d["activations_by_op"]:
        ops = Table(title="activations alive at the peak, by the op that made them", title_justify="left")
        ops.add_column("op")
        ops.add_column("GiB", justify="right")
        for op, value in list(d["activations_by_op"].items())[:TOP_OPS]:
            ops.add_row(op, gib(value))
        console.print(ops)

    console.print("[bold]emulations applied[/] (see reportgen/trace/emulations.py for each source):")
    for e in d["emulations"]:
        console.print(f"  [cyan]{e['name']}[/]: {e['what']}", highlight=False)
    for note in d["notes"]:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
