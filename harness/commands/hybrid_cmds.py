"""``esp-check hybrid``: firmware that keeps ESP-NN everywhere except the ops that break (docs/hybrid.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from harness.analysis.report import safe_markup
from harness.commands.common import (
    FILE,
    OP_LIST,
    FiniteFloat,
    input_options,
    job_options,
    make_console,
    native_options,
    out_option,
    path_option,
    with_options,
)
from harness.commands.device_cmds import _BUILD, BOARD_OPTION, HTML_OPTION, stage_progress, timeout_options
from harness.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from harness.flows.hybrid import HybridResult
    from harness.flows.job import JobOptions

_WHERE = (
    BOARD_OPTION,
    click.option(
        "--port",
        help="Serial port, as for flash-and-compare (default: auto; a fresh sim:// board if simulated).",
    ),
    out_option(
        "esp-check-hybrid", "Artifact directory: baseline/, runs/, hybrid-dropin/, repro/, report.json."
    ),
    click.option("--no-reference", is_flag=True, help="Verify against the ANSI C build only (no host)."),
)
_CHOICE = (
    click.option("--ansi-ops", type=OP_LIST, metavar="17,18", help="Run these op instances on ANSI C."),
    click.option(
        "--ansi-kinds",
        metavar="CONV_2D,ADD",
        help="Run every op of these kinds on ANSI C.",
    ),
    click.option(
        "--bisect",
        is_flag=True,
        help="Find the ops by bisection (ANSI C on halves of the op range) instead of taps: for crashes, "
        "hangs or too little RAM for the tap buffers.",
    ),
    click.option(
        "--max-rounds",
        type=click.IntRange(1, 32),
        default=4,
        help="At most this many tap rounds / culprits found by bisection.",
    ),
    click.option(
        "--noise-band",
        type=FiniteFloat(min=0.0, max=0.9),
        default=0.10,
        help="ESP-NN audit: a speedup within 1 +- this counts as ANSI C speed.",
    ),
)
_OUTPUT = (
    click.option("--json", "as_json", is_flag=True, help="Print report.json on stdout."),
    HTML_OPTION,
    path_option(
        "--bundle",
        help="Write a zip for an upstream report (drop-in files, one-op reproducers, logs).",
    ),
)


@click.command("hybrid")
@click.argument("model", type=FILE)
@input_options
@with_options(*_WHERE, *_BUILD)
@timeout_options
@with_options(*_CHOICE, *_OUTPUT)
@native_options
@job_options
def hybrid_cmd(
    model: Path,
    inputs: tuple[Path, ...],
    board: str,
    port: str | None,
    out_dir: Path,
    job: JobOptions,
    ansi_ops: list[int] | None,
    ansi_kinds: str | None,
    bisect: bool,
    max_rounds: int,
    noise_band: float,
    as_json: bool,
) -> int:
    """Build MODEL's firmware with ESP-NN optimized kernels except the ops that break, which run esp-nn's
    ANSI C kernels; verify it bit for bit against the ANSI C build and the host reference.

    The ops come from the taps (where optimized first departs, round after round), from --ansi-ops /
    --ansi-kinds, or from --bisect. Exit code: 0 a verified hybrid is offered (or none was needed),
    1 no hybrid verified, 2 usage error, 3 infrastructure error, 4 firmware fault and no fix found.
    """
    # lazy: the pipeline pulls pyserial; `esp-check --help` loads this module without it
    from harness.flows.hybrid import HybridOptions, hybrid

    if not inputs:
        raise UsageError("hybrid needs at least one --input", hint="pass --input FILE (repeatable)")
    if bisect and (ansi_ops or ansi_kinds):
        raise UsageError("--bisect finds the ops itself", hint="drop --ansi-ops/--ansi-kinds, or --bisect")
    kinds = tuple(k.strip() for k in (ansi_kinds or "").split(",") if k.strip())
    opts = HybridOptions(
        ansi_ops=tuple(ansi_ops or ()), ansi_kinds=kinds, bisect=bisect, max_rounds=max_rounds,
        noise_band=noise_band,
    )  # fmt: skip
    console = make_console(stderr=True)
    progress = stage_progress(console, None)
    result = hybrid(
        model, list(inputs), board=board, port=port, out_dir=out_dir, options=opts, job=job, progress=progress
    )
    if as_json:
        click.echo(json.dumps(json.loads(result.report_path.read_text(encoding="utf-8")), indent=2))
    else:
        print_hybrid(console, result)
    return int(result.exit_code)


def print_hybrid(console: Console, result: HybridResult) -> None:
    """Culprits, runs, cost, drop-in, reproducers, audit findings, the verdict line."""
    for c in result.culprits:
        how = safe_markup(c["found_by"])
        console.print(f"[bold]op {c['op']} ({c['kind']})[/bold] runs ANSI C (found by {how})")
    if result.runs:
        kind = " (SIMULATED BOARD)" if result.simulated else ""
        t = Table("run", "ops on ANSI C", "tapped", "result", "why", title="hybrid firmware runs" + kind)
        for r in result.runs:
            t.add_row(r.label, ",".join(map(str, r.ansi_ops)) or "-", "yes" if r.tapped else "no", r.outcome,
                      safe_markup(r.why[:70]))  # fmt: skip
        console.print(t)
    if result.bisection is not None:
        b = result.bisection.to_dict()
        console.print(
            f"bisection: {b['runs']} run(s) over {b['switchable_ops']} switchable ops, per culprit "
            f"{b['runs_per_culprit']} (bound ceil(log2 N)+1 = {b['bound_per_culprit']}): "
            f"{safe_markup(b['message'])}"
        )
    if result.cost:
        console.print(f"cost: {safe_markup(str(result.cost['summary']))}")
    if result.dropin:
        console.print(f"drop-in files: {safe_markup(result.dropin['dir'])} (README.md says how to add them)")
        for line in result.dropin["registration"]:
            console.print(f"    {safe_markup(line)}")
    for rep in result.repro:
        ok = "verified on the host" if rep.get("ok") else f"NOT verified: {rep.get('why', '')}"
        where = safe_markup(str(rep.get("dir", "-")))
        console.print(f"one-op reproducer of op {rep['op']}: {where} ({safe_markup(ok)})")
    for k in result.audit["kinds"] if result.audit else []:
        console.print(f"[yellow]ESP-NN audit:[/yellow] {safe_markup(k['message'])}")
    for note in result.notes:
        console.print(f"note: {safe_markup(note)}")
    for warn in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {safe_markup(warn)}")
    for err in result.errors:
        console.print(f"[red]error:[/red] {safe_markup(err)}")
    color = "green" if result.exit_code == ExitCode.MATCH else "red"
    console.print(
        f"[bold {color}]{safe_markup(result.message)}[/bold {color}] (exit {int(result.exit_code)})"
        + ("  \\[SIMULATED: no real ESP32 was used]" if result.simulated else "")
    )
    console.print(f"artifacts: {result.out_dir}  report: {result.report_path}")
