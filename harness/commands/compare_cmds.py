"""``esp-check compare A B``: diff two captured runs (and optionally the host reference)."""

from __future__ import annotations

import click

from harness.analysis import junit as junit_xml
from harness.analysis.compare import compare_files
from harness.analysis.report import junit_error_tree, junit_tree, print_report, report_dict
from harness.commands.common import POSITIVE, echo_json, lsb_option, schema_version_option
from harness.errors import EspCheckError
from harness.model.files import LOG_MAX_BYTES, read_regular


def _raw(path: str) -> bytes:
    """The file for the JUnit report's attachment: nothing for a FIFO, a device or an absurd size."""
    try:
        return read_regular(path, what="capture", max_bytes=LOG_MAX_BYTES)
    except EspCheckError:
        return b""


def _junit_of_error(exc: EspCheckError, junit: str, a: str, b: str) -> None:
    """The JUnit report of a compare that could not run. When it cannot be written either, the error
    that came first still decides the exit code: the write's failure is only a warning beside it."""
    try:
        junit_xml.write(junit_error_tree(str(exc), exc.exit_code, {a: _raw(a), b: _raw(b)}), junit)
    except EspCheckError as failed:
        click.echo(f"warning: no JUnit report: {failed.message}", err=True)


@click.command("compare")
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option(
    "--model",
    type=click.Path(dir_okay=False),
    help="The .tflite: output scale/zero point, model hash "
    "check, and (with --input) the host reference as a third leg.",
)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Input the firmware ran (repeat for K inputs, in order); needs --model.",
)
@click.option("--scale", type=POSITIVE, help="Output scale, for logs that do not carry it.")
@click.option(
    "--zero-point", type=click.IntRange(-(2**31), 2**31 - 1), help="Output zero point (with --scale)."
)
@lsb_option("--tolerance-lsb", "Allowed |A-B| per element (optimized vs ANSI C; ESP-NN promises bit-exact).")
@lsb_option("--ref-tolerance-lsb", "Allowed difference of each side from the host reference.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report (docs/report-schema.json).")
@schema_version_option()
@click.option("--junit", type=click.Path(dir_okay=False), help="Also write a JUnit XML report here.")
def compare_cmd(
    a: str,
    b: str,
    model: str | None,
    inputs: tuple[str, ...],
    scale: float | None,
    zero_point: int | None,
    tolerance_lsb: float,
    ref_tolerance_lsb: float,
    as_json: bool,
    schema_version: int | None,
    junit: str | None,
) -> int:
    """Compare two captured runs A and B: serial logs (protocol or legacy 'Output:' lines), results
    JSON or .npy. Exit 0 match, 1 mismatch, 2 usage/input error, 3 corrupted capture, 4 firmware fault."""
    try:
        result = compare_files(
            a,
            b,
            model=model,
            inputs=inputs,
            scale=scale,
            zero_point=zero_point,
            tolerance_lsb=tolerance_lsb,
            ref_tolerance_lsb=ref_tolerance_lsb,
        )
    except EspCheckError as exc:
        if junit:
            _junit_of_error(exc, junit, a, b)
        raise
    if junit:
        junit_xml.write(junit_tree(result), junit)
    if as_json:
        echo_json(lambda: report_dict(result, schema_version))
    else:
        print_report(result)
    return int(result.exit_code)
