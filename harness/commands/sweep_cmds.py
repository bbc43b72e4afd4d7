"""``esp-check sweep``: ESP-NN kernel geometry sweeps with sanitizers, three ways (docs/sweep.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from harness.analysis.sweep_cases import OPS
from harness.analysis.sweep_model import model_cases
from harness.commands.common import CACHE_DIR_OPTION, DIR, make_console, out_option
from harness.flows.sweep import SweepOptions, sweep
from harness.model.loader import load_model

if TYPE_CHECKING:
    from rich.console import Console

    from harness.analysis.sweep_cases import Case


@click.command("sweep")
@click.option(
    "--components-dir",
    type=DIR,
    envvar="ESP_CHECK_COMPONENTS_DIR",
    help="directory holding esp-nn and esp-tflite-micro (env ESP_CHECK_COMPONENTS_DIR)",
)
@click.option(
    "--espnn",
    "espnn_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="the esp-nn component directory to sweep (wins over --components-dir)",
)
@click.option(
    "--tflm",
    "tflm_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="the esp-tflite-micro directory whose reference kernels judge esp-nn",
)
@click.option("--op", "ops", multiple=True, type=click.Choice(list(OPS)), help="ops to sweep (default: all)")
@click.option(
    "--cases",
    "cases_per_op",
    type=click.IntRange(1, 10_000_000),
    default=200,
    help="cases per op",
)
@click.option(
    "--from-model",
    "from_model",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="sweep this .tflite's own esp-nn op geometries and their neighbours (channels -8..+8, "
    "spatial +-1, each stride and padding) instead of generated ones; --op filters them",
)
@click.option("--seed", type=click.IntRange(0, 2**31), default=0)
@click.option("--all", "api_space", is_flag=True, help="the raw API space, not only what TFLite produces")
@click.option("--no-sanitize", is_flag=True, help="skip the ASan+UBSan build (faster, blind to overruns)")
@click.option("--no-shrink", is_flag=True, help="write each finding's example as drawn, not shrunk")
@click.option("--bits", type=click.Choice(["32", "64"]), default="64")
@click.option("--jobs", type=click.IntRange(1, 256), help="parallel compile jobs")
@CACHE_DIR_OPTION
@out_option("esp-check-sweep")
def sweep_cmd(
    components_dir: Path | None,
    espnn_dir: Path | None,
    tflm_dir: Path | None,
    ops: tuple[str, ...],
    cases_per_op: int,
    from_model: Path | None,
    seed: int,
    api_space: bool,
    no_sanitize: bool,
    no_shrink: bool,
    bits: str,
    jobs: int | None,
    cache_dir: Path | None,
    out_dir: Path,
) -> int:
    """Call esp-nn's kernels directly (optimized vs ANSI C vs TFLM's reference) over generated geometries."""
    con = make_console()
    options = SweepOptions(
        ops=ops or tuple(OPS),
        cases_per_op=cases_per_op,
        seed=seed,
        api_space=api_space,
        sanitize=not no_sanitize,
        shrink=not no_shrink,
        components_dir=components_dir,
        espnn_dir=espnn_dir,
        tflm_dir=tflm_dir,
        bits=int(bits),
        jobs=jobs,
        cache_dir=cache_dir,
    )
    if from_model is not None:
        options.cases = _model_cases(con, from_model, seed, options.ops)
    result = sweep(options, out_dir, progress=lambda m: con.print(f"[dim]{m}[/dim]"))
    con.print(
        f"NATIVE sweep: {result.cases} cases in {result.seconds:.1f} s ({result.cases_per_second:.0f}/s); "
        f"reference {'compiled' if result.reference else 'NOT available (opt vs ANSI only)'}"
    )
    _print_findings(con, result.findings)
    if result.not_compared:
        nothing = ", ".join(result.not_compared)
        con.print(
            f"[yellow]compared nothing[/yellow] (kernels absent or ANSI C twice, no reference): {nothing}"
        )
    verdict = {
        0: "no finding",
        1: "findings (wrong values)",
        2: "nothing compared (see above)",
        4: "findings (sanitizer report or crash)",
    }
    con.print(f"{verdict[result.exit_code]}; report: {out_dir / 'sweep.json'}")
    return result.exit_code


def _print_findings(con: Console, findings: Sequence[Mapping[str, object]]) -> None:
    """One line per finding group, then what reaches it and how to reproduce it."""
    for f in findings:
        where = "TFLite-reachable" if f["tflite_reachable"] else "API-only"
        san = f.get("sanitizer")
        extra = f"{f['variant']}: {san['error']}" if isinstance(san, dict) else f.get("crash") or ""
        con.print(
            f"  {f['kind']:<18} {f['op']:<15} {f['class']:<32} {f['cases']:>5} case(s)  {where}  {extra}",
            highlight=False,
            markup=False,
        )
        if f.get("why_api_only"):
            con.print(f"      API-only: {f['why_api_only']}", highlight=False, markup=False)
        repro = f.get("repro")
        command = repro.get("command") if isinstance(repro, dict) else None
        if command:
            con.print(f"      reproduce: {command}", highlight=False, markup=False)


def _model_cases(con: Console, from_model: Path, seed: int, ops: tuple[str, ...]) -> list[Case]:
    """The cases of ``--from-model``, filtered by ``--op`` (none left: the sweep refuses); the ops it
    cannot sweep are printed."""
    cases, skipped = model_cases(load_model(from_model), seed)
    cases = [c for c in cases if c.op in ops]
    for k, c in enumerate(cases, 1):
        c.id = k
    for sk in skipped:
        con.print(f"[yellow]not swept:[/yellow] op {sk['op']} {sk['opcode']}: {sk['why']}", highlight=False)
    return cases
