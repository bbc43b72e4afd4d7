"""``esp-check flash-and-compare``: the main job, on a real or simulated board."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.analysis.dataset import PAIRS
from harness.analysis.report import print_report, safe_lines, safe_markup
from harness.commands.common import (
    ARENA_KB,
    BAUD,
    CACHE_DIR_OPTION,
    FILE,
    OP_LIST,
    SECONDS,
    VERDICT_COLOURS,
    echo_json,
    grouped_options,
    input_options,
    job_options,
    lsb_option,
    make_console,
    native_options,
    out_option,
    path_option,
    schema_version_option,
    with_options,
)
from harness.errors import UsageError, Verdict
from harness.firmware.backtrace import describe
from harness.firmware.build import BUILDERS
from harness.flows.records import StageTimeouts, entries, section
from harness.flows.report import check_report_version, report_as, write_refusal

if TYPE_CHECKING:
    from rich.status import Status

    from harness.analysis.tap import TapResult
    from harness.flows.dataset import DatasetOptions
    from harness.flows.job import JobOptions
    from harness.flows.records import FlashAndCompareResult, FlashFacts
    from harness.jsontypes import JSONValue


# ``--capture-timeout``, ``--silence-timeout``, ``--build-timeout`` as one ``timeouts`` argument
timeout_options = grouped_options(
    "timeouts",
    StageTimeouts,
    click.option(
        "--capture-timeout",
        "capture_total",
        type=SECONDS,
        default=180.0,
        help="Seconds to wait for one run's END record.",
    ),
    click.option(
        "--silence-timeout",
        "capture_silence",
        type=SECONDS,
        default=30.0,
        help="Seconds without a byte from the board before giving up.",
    ),
    click.option(
        "--build-timeout",
        "build",
        type=SECONDS,
        default=1800.0,
        help="Seconds a build may print nothing before it is stopped (silence, not total time).",
    ),
)


# flash-and-compare's flags as data, grouped by what they are about
BOARD_OPTION = click.option("--board", default="sim", help="Board name (esp-check boards) or TOML file.")
_BOARD = (
    BOARD_OPTION,
    click.option(
        "--port",
        help="Serial port: device path, 'auto', rfc2217://host:port, socket://host:port, sim://NAME?... or "
        "native://NAME (default: auto; on a simulated or native board, a fresh one).",
    ),
    out_option("esp-check-out", "Artifact directory: projects, build/flash/serial logs, results, report."),
)
_VERDICT = (
    lsb_option("--tolerance-lsb", "Allowed |optimized - ANSI C| in LSB (ESP-NN promises bit-exactness: 0)."),
    lsb_option("--ref-tolerance-lsb", "Allowed |device - host reference| in LSB."),
    click.option(
        "--no-reference", is_flag=True, help="Skip the host TFLM reference (two-way comparison only)."
    ),
    click.option(
        "--allow-untested",
        is_flag=True,
        help="Run a model in which ESP-NN accelerates no op on the board's chip (a float or int16 model): "
        "refused with exit 2 without it, since both variants run the same kernels.",
    ),
)
_BUILD = (
    click.option("--builder", type=click.Choice(BUILDERS), help="Override the board's builder."),
    CACHE_DIR_OPTION,
    click.option("--flash-baud", type=BAUD, help="Flashing baud rate (default: the board's)."),
    click.option("--arena-kb", type=ARENA_KB, help="Tensor arena size (default: measured + margin)."),
)
HTML_OPTION = path_option("--html", help="Write a self-contained HTML report here.")
_REPORTS = (
    click.option("--json", "as_json", is_flag=True, help="Print the JSON report on stdout."),
    schema_version_option(),
    path_option("--junit", help="Write a JUnit XML report here."),
    HTML_OPTION,
    path_option("--bundle", help="Write a reproduction bundle (.zip) for a bug report here."),
)
_TAP = (
    click.option(
        "--tap",
        is_flag=True,
        help="Per-op checksums on the device: name the first op where optimized departs from ANSI C and "
        "the host, dump it in a second run, and time every op.",
    ),
    click.option(
        "--dump-ops",
        type=OP_LIST,
        metavar="17,18",
        help="With --tap: also dump these ops' input and output tensors in the second run.",
    ),
)


_DATASET = (
    click.option(
        "--dataset",
        type=click.Path(path_type=Path),
        help="Run a whole dataset instead of --input: a folder of inputs (a sub-folder per class gives "
        "labels), an .npz (x[, y]) or a .txt list of paths. Inputs are streamed to the board.",
    ),
    click.option(
        "--random-inputs",
        type=click.IntRange(1, 100_000),
        help="Run N random inputs drawn on the device by its PRNG (no upload; the host replays them).",
    ),
    click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=0),
    click.option(
        "--results",
        type=click.Choice(["full", "crc"]),
        default="full",
        help="full: every output comes back; crc: CRC-32s only, and the inputs whose CRC differs in full.",
    ),
    path_option("--labels", help="Labels for accuracy: CSV (name,label) or JSON ({name: label})."),
    click.option(
        "--repeat",
        type=click.IntRange(1, 1000),
        default=1,
        help="Invoke each input N times and flag any change (and re-run after a reset).",
    ),
    click.option(
        "--keep-chunks",
        type=click.Choice(["auto", "always", "never"]),
        default="auto",
        help="A dataset larger than the board's kept-input store: run it in chunks of the store's size, so "
        "every input crosses the link once (always), only when that is cheaper on this link (auto), or "
        "upload the inputs beyond the store to each variant (never).",
    ),
    click.option(
        "--tap-inputs",
        metavar="3,17,worst",
        help="After the dataset run, run --tap on these inputs: dataset indices (from 0) and/or 'worst' "
        "(the top-ranked disagreeing input). They are written as .npy under OUT/tap-inputs.",
    ),
)


class _FlashAndCompareCommand(click.Command):
    """flash-and-compare, whose usage errors found before the run (click's checks of the flags, flags
    that exclude each other) rewrite an earlier report.json in --out as usage_error, as the run's own
    usage errors do: the last run's "match" must not stay beside a command line that was refused."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            write_refusal(_out_in_args(given), exc.format_message())
            raise

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            if not ctx.meta.get(_FLOW_STARTED):  # the flow writes its own report
                write_refusal(ctx.params.get("out_dir") or Path("esp-check-out"), exc.message)
            raise


_FLOW_STARTED = "esp_check.flow_started"


def _out_in_args(args: list[str]) -> Path:
    """The --out an unparsable command line names (its last one), or the default."""
    out = "esp-check-out"
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            out = args[i + 1]
        elif a.startswith("--out="):
            out = a.split("=", 1)[1]
    return Path(out)


@click.command("flash-and-compare", cls=_FlashAndCompareCommand)
@click.argument("model", type=FILE)
@input_options
@with_options(*_BOARD, *_VERDICT, *_BUILD)
@timeout_options
@with_options(*_REPORTS, *_TAP, *_DATASET)
@native_options
@job_options
def flash_and_compare_cmd(
    model: Path,
    inputs: tuple[Path, ...],
    board: str,
    port: str | None,
    out_dir: Path,
    job: JobOptions,
    as_json: bool,
    schema_version: int | None,
    dataset: Path | None = None,
    random_inputs: int | None = None,
    seed: int = 0,
    results: str = "full",
    labels: Path | None = None,
    repeat: int = 1,
    tap_inputs: str | None = None,
    keep_chunks: str = "auto",
) -> int:
    """Build MODEL with ESP-NN optimized and ANSI C kernels, run both on the board, compare.

    Exit code: 0 match, 1 mismatch, 2 usage error, 3 infrastructure error, 4 firmware fault.
    """
    # lazy: the pipeline pulls pyserial; `esp-check --help` loads this module without it
    from harness.flows.dataset import DatasetOptions
    from harness.flows.flash_and_compare import flash_and_compare

    asked = DatasetOptions(dataset, random_inputs, seed, results, labels, repeat, chunks=keep_chunks)
    data = _dataset_options(bool(inputs), job.tap, tap_inputs, asked)
    check_report_version(schema_version)
    if job.dump_ops and not (job.tap or tap_inputs):
        raise UsageError("--dump-ops needs --tap (or --tap-inputs in a dataset run)", hint="add --tap")
    console = make_console(stderr=True)
    # A spinner only where one shows: on a pipe or a file a rich Status prints nothing, and importing
    # it (rich.live, rich.spinner's table) costs 0.03 s of a repeat run's CPU.
    status = console.status("starting", spinner="dots") if console.is_terminal else None
    progress = stage_progress(console, status)
    click.get_current_context().meta[_FLOW_STARTED] = True
    with status if status is not None else contextlib.nullcontext():
        options = job.replace(dataset=data)
        result = flash_and_compare(
            model, list(inputs), board=board, port=port, out_dir=out_dir, options=options, progress=progress
        )
    if as_json:
        doc = json.loads(result.report_path.read_text(encoding="utf-8"))
        echo_json(lambda: report_as(doc, schema_version))
        _print_verdict(console, result)  # stdout holds the JSON; the one verdict line goes to stderr
    else:
        _print_summary(console, result)
    return int(result.exit_code)


def stage_progress(console: Console, status: Status | None) -> Callable[[str, str], None]:
    """A spinner (on a terminal) names the stage in progress; each finished stage leaves one line."""
    t0 = time.monotonic()

    def progress(stage: str, message: str) -> None:
        if message == "started":
            if status is not None:
                status.update(f"{escape(stage)} ...")
            return
        style = "red" if message.startswith("failed") else "green"
        when = f"{time.monotonic() - t0:7.1f}s"
        console.print(f"[dim]{when}[/dim] [{style}]{escape(f'{stage:<22}')}[/{style}] {safe_markup(message)}")

    return progress


def _dataset_options(
    has_inputs: bool, tap: bool, tap_inputs: str | None, data: DatasetOptions
) -> DatasetOptions | None:
    """The checked DatasetOptions, or None for a run on --input files."""
    if data.source is None and data.random_inputs is None:
        if not has_inputs:
            raise UsageError(
                "flash-and-compare needs at least one --input (or --dataset / --random-inputs)",
                hint="pass --input FILE (repeatable)",
            )
        _refuse_given(
            DATASET_ONLY,
            "only to a dataset run, not to --input files",
            "drop it, or run --dataset DIR / --random-inputs N",
        )
        if tap_inputs is not None:
            raise UsageError("--tap-inputs needs --dataset or --random-inputs", hint="with --input: --tap")
        return None
    if has_inputs:
        raise UsageError("--input and --dataset/--random-inputs exclude each other", hint="give one")
    if data.source is not None:
        _refuse_given(("seed",), "only to --random-inputs (a dataset's inputs are given)", hint="drop --seed")
    if tap:
        raise UsageError(
            "--tap runs on --input files; in a dataset run, name the inputs to tap",
            hint="use --tap-inputs 3,17 (dataset indices) or --tap-inputs worst",
        )
    if tap_inputs is not None:
        data = dataclasses.replace(data, tap_inputs=tuple(t.strip() for t in tap_inputs.split(",")))
    data.check()
    return data


# flags that mean something only in a dataset run (--tap-inputs is refused on its own, with a hint)
DATASET_ONLY = ("repeat", "labels", "results", "seed", "keep_chunks")


def _refuse_given(names: tuple[str, ...], why: str, hint: str) -> None:
    """Refuse the flags among ``names`` the user gave (not defaults): a flag that does not apply would
    otherwise be ignored silently (e.g. --repeat 3 on --input files checks no determinism)."""
    ctx = click.get_current_context()  # called by the command only
    given = [
        n for n in names if ctx.get_parameter_source(n) not in (None, click.core.ParameterSource.DEFAULT)
    ]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{flags} {verb} {why}", hint=hint)


def _print_summary(console: Console, result: FlashAndCompareResult) -> None:
    refused = result.reference_refused
    if result.comparison is not None:  # the run's one verdict line comes last (_print_verdict)
        label = "optimized vs ANSI C only (the host reference refused)" if refused else None
        print_report(result.comparison, console, verdict_label=label, simulated=result.simulated)
    kind = " (SIMULATED BOARD)" if result.simulated else ""
    kind = " (NATIVE: built for this PC)" if result.native else kind
    table = Table(
        "variant", "firmware", "flash", "capture", "ESP-NN mode", "findings", title="flash-and-compare" + kind
    )
    shown: list[tuple[str, FlashFacts]] = []  # both variants are flashed in one esptool session: show it once
    for v, r in result.variants.items():
        flash = "-"
        same = next((w for w, f in shown if r.flash and f == r.flash), None)
        if same is not None and r.flash:  # a skipped flash had no session: both variants' images were held
            flash = f"skipped with {same}" if r.flash.get("skipped") else f"same esptool session as {same}"
        elif r.flash:
            written = sum(x["bytes_written"] for x in r.flash["regions"])
            skipped = sum(1 for x in r.flash["regions"] if x["skipped"])
            flash = f"{written} B written, {skipped} region(s) already there"
            flash = r.flash.get("skipped") or flash  # no esptool session: the HELLO hashes matched
            shown.append((v, r.flash))
        findings = safe_markup(
            ", ".join(f"{f['kind']} ({getattr(f['severity'], 'value', f['severity'])})" for f in r.findings)
            or "-"
        )
        table.add_row(
            v,
            (r.firmware_sha256 or "-")[:12] + (" (cached)" if r.build_cache_hit else ""),
            flash,
            "valid" if r.capture_valid else safe_markup("; ".join(r.problems)[:60] or "not valid"),
            safe_markup(r.nn_mode or "-"),
            findings,
        )
    console.print(table)
    _print_backtraces(console, result)
    if result.dataset is not None:  # the dataset first, then the tap run on its chosen inputs
        _print_dataset(console, result.dataset)
        for d in map(section, entries(result.dataset.get("tap_inputs"))):
            console.print(f"  tapped input {d['index']} ({d['chosen_as']}): {safe_markup(str(d['file']))}")
        for note in entries(result.dataset.get("tap_notes")):
            console.print(f"  [yellow]{safe_markup(str(note))}[/yellow]")
    if result.tap is not None:
        _print_tap(console, result.tap)
    for warn in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {safe_lines(warn)}")
    for err in result.errors:
        console.print(f"[red]error:[/red] {safe_lines(err)}")
    for s in result.stages:  # a failed stage whose error is already listed above is not said twice
        if s.status == "failed" and not any(s.detail and s.detail in e for e in result.errors):
            console.print(
                f"[red]{escape(s.stage)} \\[{escape(s.variant or '-')}] failed:[/red] {safe_lines(s.detail)}"
            )
    _print_verdict(console, result)


def _print_verdict(console: Console, result: FlashAndCompareResult) -> None:
    """The run's one verdict line, with what it rests on, then where the artifacts are."""
    refused = result.reference_refused
    color = VERDICT_COLOURS.get(Verdict.from_exit_code(result.exit_code), "yellow")
    console.print(
        f"[bold {color}]verdict: {result.verdict}[/bold {color}] (exit {int(result.exit_code)})"
        + ("  \\[SIMULATED: no real ESP32 was used]" if result.simulated else "")
        + (f"  \\[NATIVE, {result.native['bits']}-bit: no chip was used]" if result.native else "")
        + ("  [bold red]\\[HOST REFERENCE REFUSED: no match claimed][/bold red]" if refused else "")
        + (
            "  [bold yellow]\\[ESP-NN NOT TESTED: it accelerates none of the ops][/bold yellow]"
            if result.espnn_untested
            else ""
        )
    )
    if result.native:
        console.print(f"[bold]{escape(result.native['meaning'])}[/bold]")
    console.print(f"artifacts: {result.out_dir}  report: {result.report_path}")


def _number(value: JSONValue) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _print_dataset(console: Console, doc: dict[str, JSONValue]) -> None:
    """Verdict counts, agreement, LSB per output, top-1 / accuracy and the worst inputs of a dataset run."""
    a = doc.get("analysis")
    if not isinstance(a, dict):
        console.print("[yellow]dataset: no results to analyse[/yellow]")
        return
    counts = ", ".join(f"{k} {v}" for k, v in sorted(section(a.get("verdicts")).items()))
    console.print(f"dataset {safe_markup(str(doc['source']))}: {doc['inputs']} inputs: {counts}")
    cols = ("pair", "compared", "bit-exact", "within tolerance", "max LSB per output", "mean LSB per output")
    t = Table(*cols, title="agreement over the dataset")
    for pair, part in section(a.get("agreement")).items():
        s = section(part)
        mean = ", ".join("-" if m is None else f"{m:.4g}" for m in entries(s.get("mean_lsb_per_output")))
        t.add_row(
            pair.replace("_vs_", " vs "),
            str(s["compared"]),
            str(s["bit_exact"]),
            f"{s['within_tolerance']} ({_number(s['agreement']) * 100:.1f}%)",
            ", ".join(f"{m:g}" for m in entries(s.get("max_lsb_per_output"))) or "-",
            mean or "-",
        )
    console.print(t)
    for pair, part in section(a.get("top1_agreement")).items():
        s = section(part)
        console.print(f"  top-1 {pair.replace('_vs_', ' vs ')}: {s['agree']}/{s['compared']}")
    for leg, part in section(a.get("accuracy")).items():
        s = section(part)
        if s.get("labelled"):
            share = 100 * _number(s["correct"]) / _number(s["labelled"])
            console.print(f"  accuracy {leg}: {s['correct']}/{s['labelled']} ({share:.1f}%)")
    bad = entries(a.get("disagreeing"))
    if bad:
        heads = ("input", "verdict", "opt vs ansi", "opt vs host", "ansi vs host")
        t = Table(*heads, title="inputs that disagree, largest difference first")
        for row in bad[:10]:
            r = section(row)
            lsb = section(r.get("max_lsb"))
            cells = [str(v) if (v := lsb.get(key)) is not None else "-" for key in PAIRS]
            t.add_row(safe_markup(f"{r['index']} {r['name']}"), str(r["verdict"]), *cells)
        console.print(t)
    reset = section(doc.get("after_reset"))
    if reset:
        differing = len(entries(reset.get("differing")))
        console.print(
            f"  after a reset ({reset['variant']}): {reset['inputs']} inputs run again, {differing} differ"
        )
    console.print("  per-input verdicts: report.json dataset.analysis.rows")


def _print_backtraces(console: Console, result: FlashAndCompareResult) -> None:
    """Each crash's decoded call chain (or why it was not decoded), under the table."""
    for v, r in result.variants.items():
        for f in r.findings:
            line = describe(section(f.get("details")))
            if line:
                console.print(f"  {escape(v)} {safe_markup(f['kind'])}: {safe_markup(line)}")


def _print_tap(console: Console, tap: TapResult) -> None:
    """First divergent op, dump analysis and the per-op timing table of a --tap run."""
    from harness.analysis.tap import timing_cells  # lazy: a run without --tap never loads the tap analysis

    style = "bold red" if tap.culprit is not None or tap.findings else "green"
    console.print(f"[{style}]tap: {safe_markup(tap.headline)}[/{style}]")
    for line in tap.summary_lines():
        console.print(f"  {safe_markup(line)}")
    if tap.ram_bytes:
        ram = ", ".join(f"{v} {n} B" for v, n in tap.ram_bytes.items())
        console.print(f"  tap RAM overhead on the device: {ram}")
    timing = tap.timing
    if timing:
        t = Table(title="per-op time by op type (from the device's cycle counter)")
        for col in ("op type", "count", "optimized us", "ansi us", "speedup"):
            t.add_column(col, justify="right" if col != "op type" else "left")
        for name, row in timing["by_type"].items():
            t.add_row(name, str(row["count"]), *timing_cells(row["us"], row.get("speedup")))
        t.add_row("total", str(len(timing["ops"])), *timing_cells(timing["total_us"], timing.get("speedup")))
        console.print(t)
        console.print("  per-op rows: report.json tap.timing.ops")
