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


def print_lengths_replay(d: dict, gpu, console: Console | None = None) -> None:
    """``reportgen trace --lengths`` (``trace/multistep.lengths_replay``): the reserve the replayed steps grew,
    beside the analytic answer of ``estimate --lengths`` (``estimate/lengths.reserved_growth``)."""
    console = console or Console()
    steps, traced = d["steps"], d["traced_lengths"]
    micro = f"{d['accum']} micro-batches of {d['batch']}" if d["accum"] > 1 else f"batch {d['batch']}"
    padded = {"longest": "padded to their longest sample", "packed": f"packed into rows of {d['cap']:,} tokens",
              "max": f"padded to {d['cap']:,} tokens"}[d["padding"]]
    console.print(f"[bold]{d['model']}[/] on [bold]{gpu.name}[/] ({gpu.memory_bytes / GIB:.1f} GiB): {steps} steps of "
                  f"{micro} {padded}, drawn from {d['file']} (seed {d['seed']}), replayed through one caching "
                  "allocator  [magenta]traced[/]", highlight=False)
    shown = ", ".join(f"{n:,}" for n in traced[:8]) + (f", ... ({len(traced)} in all)" if len(traced) > 8 else "")
    console.print(f"step traced at {len(traced)} length(s): {shown} tokens"
                  + (f" (padded up to a multiple of {d['pad_multiple']} to trace at most {len(traced)})"
                     if d["pad_multiple"] > 1 else ""), highlight=False)
    analytic = d["analytic"]
    table = Table(title="reserved (simulated max_memory_reserved, GiB = 2^30 bytes)", title_justify="left")
    for column in ("", "longest", "traced replay", "analytic"):
        table.add_column(column, justify="left" if not column else "right")
    def priced(row: dict, longest: int) -> str:  # the analytic step's own length when the draw's differs
        at = row.get("longest")
        return gib(row.get("peak_reserved")) + (f" (at {at:,})" if at is not None and at != longest else "")

    first, longest = d["first_step"]["longest"], max(d["step_lengths"])
    table.add_row("first step", f"{first:,}", gib(d["first_step"]["peak_reserved"]),
                  priced(analytic.get("first", {}), first))
    table.add_row(f"after {steps} steps", f"{longest:,}", gib(d["peak_reserved"]),
                  priced(analytic.get(str(steps), {}), longest))
    table.add_row("the longest step alone", f"{max(traced):,}", gib(d["alone_at_longest"]), "")
    console.print(table)
    if d["difference"] is not None:
        console.print(f"traced replay vs analytic after {steps} steps: {100 * d['difference']:+.1f}%; steps of mixed "
                      f"lengths add {gib(d['peak_reserved'] - d['alone_at_longest'])} GiB of cached blocks to the "
                      "longest step's own reserve", highlight=False)
    else:
        console.print(f"no analytic answer: {analytic.get('error', '')}", highlight=False)
    if not d["fits"]:
        console.print(f"[red]over the card[/]: {gib(d['device_total'])} GiB with the CUDA context; on "
                      f"{gpu.memory_bytes / GIB:.1f} GiB the allocator would release its cached segments and retry "
                      "(not replayed)", highlight=False)
    w = d["worst_batch"]
    console.print(f"peak allocated of the worst batch: {gib(w['peak_allocated'])} GiB (step {w['step']}, "
                  f"{w['longest']:,} tokens)", highlight=False)
    for note in d.get("notes", []):
        console.print(f"note: {note}", highlight=False)


def print_grpo_agreement(g: dict, console: Console | None = None) -> None:
    """The traced GRPO step's phases beside the estimate's (``trace/agreement.grpo_agreement``)."""
    console = console or Console()
    table = Table(title="GRPO phases: largest allocated, traced vs estimated (GiB = 2^30 bytes)", title_justify="left")
    for column in ("phase", "traced", "estimated", "estimate vs trace"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for phase, row in g["phases"].items():
        gap = f"{100 * row['gap']:+.1f}%" if row["gap"] is not None else "no log-prob pass estimated"
        table.add_row(f"[bold]{phase}[/]" if phase == "peak" else phase, gib(row["traced"]),
                      gib(row["estimated"]) if row["estimated"] is not None else "", gap)
    console.print(table)
    verdict = "[green]agrees[/]" if g["agrees"] else "[red]disagrees[/]"
    console.print(f"estimate {verdict} with the traced GRPOTrainer step within {100 * g['tolerance']:.0f}% of peak "
                  "allocated", highlight=False)


def print_torchtune_agreement(g: dict, console: Console | None = None) -> None:
    """torchtune's traced recipe beside the estimate of the same file (``trace/agreement.torchtune_agreement``)."""
    console = console or Console()
    table = Table(title=f"torchtune {g['recipe']}: traced vs estimated (GiB = 2^30 bytes)", title_justify="left")
    for column in ("", "traced", "estimated", "estimate vs trace"):
        table.add_column(column, justify="left" if not column else "right")
    for name, row in g["memory"].items():
        gap = f"{100 * row['gap']:+.1f}%" if row["gap"] is not None else ""
        table.add_row(name.replace("_", " "), gib(row["traced"]), gib(row["estimated"]), gap)
    console.print(table)
    verdict = "[green]agrees[/]" if g["agrees"] else "[red]disagrees[/]"
    console.print(f"the estimate {verdict} with torchtune's traced recipe (tolerance {100 * g['tolerance']:.0f}% of "
                  f"peak allocated); this recipe's numbers: {g['status']}", highlight=False)
    console.print("the estimate prices torchtune's own model (modeling torchtune: k and v copied to every query head, "
                  "no mask on padded batches, its RoPE caches; estimate/recipes.py)", highlight=False)
