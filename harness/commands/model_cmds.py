"""`esp-check inspect` and `esp-check reference`: model facts and the host reference, no board needed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np
from rich.console import Console
from rich.table import Column, Table

from harness.analysis.report import safe_markup
from harness.commands.common import FILE, input_options, make_console, path_option
from harness.errors import ExitCode, InputDataError
from harness.model import opdata
from harness.model.arena import ArenaEstimate, estimate_arena
from harness.model.backends import tflm_available
from harness.model.inputs import InputOptions, PreparedInput, default_image_range, dequantize, load_input
from harness.model.loader import ModelInfo, TensorInfo, load_model
from harness.model.reference import LayerDisagreement, compare_backends, run_reference
from harness.protocol.spec import crc32_hex

if TYPE_CHECKING:
    from harness.model.backends import ReferenceResult

JSON_SCHEMA_INSPECT = "esp-check.inspect/1"
JSON_SCHEMA_REFERENCE = "esp-check.reference/1"
_PREVIEW = 16  # values shown per tensor in the terminal


def prepare_runs(info: ModelInfo, paths: Sequence[Path], options: InputOptions) -> list[list[PreparedInput]]:
    """Group input files into runs (N model inputs per run, in order) and prepare each."""
    n = len(info.inputs)
    if len(paths) % n:
        raise InputDataError(
            f"{len(paths)} input file(s) for a model with {n} inputs: give {n} files per run",
            hint="inputs map in order: " + ", ".join(t.name for t in info.inputs),
        )
    return [
        [load_input(p, info.inputs[i], options) for i, p in enumerate(paths[k : k + n])]
        for k in range(0, len(paths), n)
    ]


def _fmt_scale(tensor: TensorInfo) -> str:
    if tensor.scale is None:
        return "-"
    return f"{tensor.scale:.8g}" + (f" (+{len(tensor.scales) - 1} ch)" if tensor.per_channel else "")


def _table(title: str, *columns: str) -> Table:
    """A table titled on the left whose cells fold (names and shapes are shown whole)."""
    return Table(*(Column(c, overflow="fold") for c in columns), title=title, title_justify="left")


def _tensor_table(title: str, tensors: Sequence[TensorInfo]) -> Table:
    table = _table(title, "#", "name", "shape", "dtype", "scale", "zero point", "per-channel")
    for t in tensors:
        table.add_row(
            str(t.index),
            safe_markup(t.name),
            "x".join(map(str, t.shape)) or "scalar",
            t.dtype,
            _fmt_scale(t),
            "-" if t.zero_point is None else str(t.zero_point),
            "yes" if t.per_channel else "no",
        )
    return table


def _inspect_data(
    info: ModelInfo, chip: str | None, runs: list[list[PreparedInput]], arena: ArenaEstimate | None
) -> dict[str, object]:
    chips = [chip] if chip else list(opdata.FAMILY_CHIPS)
    accel = {c: opdata.espnn_model_acceleration(info, c) for c in chips}
    return {
        "schema": JSON_SCHEMA_INSPECT,
        "model": {
            "path": str(info.path),
            "size_bytes": info.size_bytes,
            "sha256": info.sha256,
            "schema_version": info.schema_version,
            "subgraphs": info.subgraph_count,
            "kind": info.kind,
        },
        "inputs": [{**t.to_dict(), "image_range": default_image_range(t).to_dict()} for t in info.inputs],
        "outputs": [t.to_dict() for t in info.outputs],
        "ops": [
            {
                "index": op.index,
                "subgraph": op.subgraph,
                "opcode": op.opcode,
                "custom_code": op.custom_code,
                "inputs": list(op.inputs),
                "outputs": list(op.outputs),
                "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in op.options.items()},
            }
            for op in info.ops
        ],
        "op_counts": info.op_counts(),
        "resolver": {"methods": list(opdata.resolver_methods(info)), "source": opdata.sources()["resolver"]},
        "espnn": {
            "source": opdata.sources()["espnn"],
            "chips": {
                c: {
                    "family": opdata.chip_family(c),
                    "implementation": opdata.family_description(c),
                    "accelerated_ops": sum(a.accelerated for a in accel[c]),
                    "ops": [asdict(a) for a in accel[c]],
                }
                for c in chips
            },
        },
        "arena": asdict(arena) if arena is not None else None,
        "input_files": [[p.to_dict() for p in run] for run in runs],
    }


def _print_inspect(
    console: Console,
    info: ModelInfo,
    chip: str | None,
    runs: list[list[PreparedInput]],
    arena: ArenaEstimate | None,
) -> None:
    console.print(
        f"[bold]{safe_markup(info.path)}[/bold]  {info.size_bytes:,} B  sha256 {info.sha256[:16]}...  "
        f"schema v{info.schema_version}  kind {info.kind}  subgraphs {info.subgraph_count}"
    )
    if info.kind != "int8":
        console.print(
            f"[yellow]note:[/yellow] {info.kind} model: ESP-NN accelerates int8 ops only; "
            "other ops run TFLM reference kernels in both firmware variants"
        )
    console.print(_tensor_table("Inputs", info.inputs))
    for t in info.inputs:
        rng = default_image_range(t)
        style = "" if rng.matched else "[yellow]warning:[/yellow] "
        console.print(
            f"{style}8-bit data (images) for input {safe_markup(t.name)} is read as {rng.name} unless "
            f"--input-range says otherwise ({safe_markup(rng.reason)})"
        )
    console.print(_tensor_table("Outputs", info.outputs))

    chips = [chip] if chip else list(opdata.FAMILY_CHIPS)
    accel = {c: {a.index: a for a in opdata.espnn_model_acceleration(info, c)} for c in chips}
    title = "Operators (execution order, subgraph 0) and ESP-NN acceleration per chip"
    ops_table = _table(title, "#", "opcode", "output shape", *chips)
    for op in info.main_ops:
        out = info.tensors[op.outputs[0]] if op.outputs and op.outputs[0] >= 0 else None
        cells = []
        for c in chips:
            a = accel[c][op.index]
            cells.append(
                "[green]yes[/green]"
                if a.accelerated
                else (f"[yellow]{a.short}[/yellow]" if a.reason.startswith("fallback") else "-")
            )
        shape = "x".join(map(str, out.shape)) if out else ""
        ops_table.add_row(str(op.index), safe_markup(op.opcode), shape, *cells)
    console.print(ops_table)

    counts = _table(
        "Op counts, resolver registrations, ESP-NN acceleration", "opcode", "count", "resolver", *chips
    )
    for opcode, n in info.op_counts().items():
        op0 = next(o for o in info.ops if o.opcode == opcode)
        per_chip = []
        for c in chips:
            k = sum(1 for a in accel[c].values() if a.opcode == opcode and a.accelerated)
            per_chip.append(f"{k}/{n}" if opdata.espnn_accelerated(opcode, c) else "-")
        method = opdata.resolver_method(opcode, op0.custom_code)
        counts.add_row(safe_markup(opcode), str(n), safe_markup(method), *per_chip)
    console.print(counts)
    methods = list(opdata.resolver_methods(info))
    console.print(
        f"tflite::MicroMutableOpResolver<{len(methods)}> resolver;  "
        + " ".join(f"resolver.{safe_markup(mth)}();" for mth in methods)
    )
    for c in chips:
        accelerated = sum(a.accelerated for a in accel[c].values())
        console.print(
            f"ESP-NN on {c}: {opdata.family_description(c)}: {accelerated}/{len(accel[c])} ops accelerated"
        )
    sources = opdata.sources()
    console.print(f"[dim]sources: {sources['resolver']}; {sources['espnn']}[/dim]")
    if arena is not None:
        _print_arena(console, arena)
    for k, run in enumerate(runs):
        for p in run:
            r = p.report
            tensor = p.tensor.name if p.tensor else None
            console.print(
                f"Input {safe_markup(p.source)} ({p.kind}) -> {safe_markup(tensor)} {p.quantized.dtype} "
                f"{'x'.join(map(str, p.quantized.shape))}  sha256 {p.sha256[:16]}...  run {k}"
            )
            for note in p.notes:
                console.print(f"  - {safe_markup(note)}")
            style = "red" if r.differing else "green"
            console.print(
                "  truncating cast without clamp `(int8_t)(x / scale + zp)` would get "
                f"[{style}]{r.differing} of {r.total}[/{style}] elements wrong "
                f"(max {r.max_abs_diff} LSB, {r.wrapped} wrapped); "
                f"{r.clamped} clamped by correct quantization"
            )


def _print_arena(console: Console, arena: ArenaEstimate) -> None:
    label = "measured" if arena.method == "measured" else "[yellow]ROUGH[/yellow]"
    chip_label = arena.chip or "worst case of " + "/".join(opdata.FAMILY_CHIPS)
    console.print(
        f"Tensor arena: host {arena.host_bytes:,} B ({label}), recommended on target "
        f"{arena.target_bytes:,} B (= host + ESP-NN scratch {arena.espnn_scratch_bytes:,} B "
        f"+ margin {arena.margin_bytes:,} B, chip {chip_label})"
    )
    console.print(f"ESP-NN scratch: {safe_markup(arena.espnn_formulas)}")
    console.print(f"[dim]{arena.note}[/dim]")


@click.command("inspect")
@click.argument("model", type=FILE)
@input_options
@click.option("--chip", help="Show ESP-NN acceleration and the arena target for this chip only.")
@click.option("--no-arena", is_flag=True, help="Skip the tensor-arena measurement.")
@click.option(
    "--esp-nn-version",
    help="esp-nn version whose scratch-buffer formulas the arena target uses (default: the version "
    "`generate` pins).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (schema esp-check.inspect/1).")
def inspect_cmd(
    model: Path,
    inputs: tuple[Path, ...],
    input_options: InputOptions,
    chip: str | None,
    no_arena: bool,
    esp_nn_version: str | None,
    as_json: bool,
) -> int:
    """Show a model's ops, tensors, resolver registrations, ESP-NN acceleration and arena estimate."""
    info = load_model(model)
    if chip is not None:
        opdata.chip_family(chip)  # validates the name
    runs = prepare_runs(info, inputs, input_options) if inputs else []
    arena = None
    if not no_arena:
        arena = estimate_arena(model, chip=chip, espnn_version=esp_nn_version)
    if as_json:
        click.echo(json.dumps(_inspect_data(info, chip, runs, arena), indent=2))
    else:
        _print_inspect(make_console(), info, chip, runs, arena)
    return int(ExitCode.MATCH)


def _tensor_json(arr: np.ndarray, tensor: TensorInfo) -> dict[str, object]:
    d: dict[str, object] = {
        "name": tensor.name,
        "shape": list(arr.shape),
        "dtype": str(arr.dtype),
        "scale": tensor.scale,
        "zero_point": tensor.zero_point,
        "crc32": crc32_hex(arr),
        "raw": arr.ravel().tolist(),
    }
    if tensor.scale is not None:
        d["dequantized"] = dequantize(arr, tensor.scale, tensor.zero_point or 0).ravel().tolist()
    return d


def _preview(values: np.ndarray) -> str:
    flat = values.ravel()
    text = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat[:_PREVIEW].tolist())
    return text + (f", ... ({flat.size} values)" if flat.size > _PREVIEW else "")


def _save_npy(save_npy: Path, result: ReferenceResult) -> None:
    """Raw outputs (and per-layer tensors) as .npy files, named by run, op and tensor."""
    save_npy.mkdir(parents=True, exist_ok=True)
    for k, run in enumerate(result.runs):
        for o, arr in enumerate(run.outputs):
            np.save(save_npy / f"run{k}.out{o}.npy", arr)
        for layer in run.layers or []:
            np.save(save_npy / f"run{k}.op{layer.op_index:03d}.t{layer.tensor_index}.npy", layer.array)


def _reference_data(
    model: Path,
    info: ModelInfo,
    runs: list[list[PreparedInput]],
    result: ReferenceResult,
    cross: list[LayerDisagreement],
) -> dict[str, object]:
    """The ``reference --json`` document (schema esp-check.reference/1)."""
    return {
        "schema": JSON_SCHEMA_REFERENCE,
        "model": {"path": str(model), "sha256": info.sha256, "size_bytes": info.size_bytes},
        "backend": result.backend,
        "backend_version": result.backend_version,
        "kernels": result.kernels,
        "authoritative": result.backend == "tflm",
        "backend_disagreements": [asdict(d) for d in cross],
        "runs": [
            {
                "inputs": [p.to_dict() for p in runs[k]],
                "outputs": [_tensor_json(arr, t) for arr, t in zip(run.outputs, info.outputs, strict=True)],
                "layers": None
                if run.layers is None
                else [
                    {
                        "op_index": la.op_index,
                        "opcode": la.opcode,
                        "tensor_index": la.tensor_index,
                        "name": la.name,
                        "shape": list(la.array.shape),
                        "dtype": str(la.array.dtype),
                        "crc32": la.crc32_hex,
                    }
                    for la in run.layers
                ],
            }
            for k, run in enumerate(result.runs)
        ],
    }


def _print_reference(
    console: Console,
    model: Path,
    info: ModelInfo,
    runs: list[list[PreparedInput]],
    result: ReferenceResult,
    cross: list[LayerDisagreement],
    *,
    per_layer: bool,
    save_npy: Path | None,
) -> None:
    """The terminal view of a reference run: outputs per run, per-layer CRCs, backend cross-check."""
    console.print(f"[bold]{safe_markup(model)}[/bold] on {result.backend_version} ({result.kernels})")
    for k, run in enumerate(result.runs):
        console.print(
            f"Run {k}: inputs "
            + ", ".join(f"{safe_markup(p.source.name)} (sha256 {p.sha256[:12]}...)" for p in runs[k])
        )
        table = _table(f"Run {k} outputs", "#", "name", "shape", "dtype", "scale", "zp", "crc32", "argmax")
        for o, (arr, t) in enumerate(zip(run.outputs, info.outputs, strict=True)):
            table.add_row(
                str(o),
                safe_markup(t.name),
                "x".join(map(str, arr.shape)),
                str(arr.dtype),
                "-" if t.scale is None else f"{t.scale:.8g}",
                str(t.zero_point),
                crc32_hex(arr),
                str(int(np.argmax(arr))),
            )
        console.print(table)
        for o, (arr, t) in enumerate(zip(run.outputs, info.outputs, strict=True)):
            console.print(f"  output {o} raw:         {_preview(arr)}")
            if t.scale is not None:
                real = dequantize(arr, t.scale, t.zero_point or 0)
                console.print(f"  output {o} dequantized: {_preview(real)}")
        if run.layers is not None:
            columns = ("op", "opcode", "tensor", "shape", "dtype", "min", "max", "crc32")
            lt = Table(*columns, title=f"Run {k} per layer", title_justify="left")
            for la in run.layers:
                lt.add_row(
                    str(la.op_index),
                    safe_markup(la.opcode),
                    str(la.tensor_index),
                    "x".join(map(str, la.array.shape)),
                    str(la.array.dtype),
                    str(la.array.min()),
                    str(la.array.max()),
                    la.crc32_hex,
                )
            console.print(lt)
    if result.backend == "litert":
        if cross:
            for d in cross:
                console.print(
                    f"[yellow]LiteRT differs from TFLM at run {d.run} op {d.op_index} ({d.opcode}): "
                    f"{d.mismatched} element(s), max {d.max_abs_diff} LSB: LiteRT is not authoritative "
                    "there[/yellow]"
                )
        elif per_layer and tflm_available():
            console.print("[green]cross-check: LiteRT matches TFLM bit for bit on every layer[/green]")
        else:
            console.print(
                "[dim]LiteRT reference kernels: not cross-checked against TFLM here (TFLM is the "
                "authoritative reference; run on Linux x86-64 with --backend tflm to confirm)[/dim]"
            )
    if save_npy is not None:
        console.print(f"saved .npy files to {save_npy}")


@click.command("reference")
@click.argument("model", type=FILE)
@input_options
@click.option("--per-layer", is_flag=True, help="Also report every intermediate tensor with its CRC32.")
@click.option(
    "--backend",
    type=click.Choice(("tflm", "litert", "auto")),
    default="tflm",
    help="tflm: tflite-micro wheel (Linux x86-64); litert: ai-edge-litert BUILTIN_REF kernels.",
)
@path_option(
    "--save-npy",
    dir=True,
    help="Write raw outputs (and layers with --per-layer) as .npy files into this directory.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (schema esp-check.reference/1)."
)
def reference_cmd(
    model: Path,
    inputs: tuple[Path, ...],
    input_options: InputOptions,
    per_layer: bool,
    backend: str,
    save_npy: Path | None,
    as_json: bool,
) -> int:
    """Run MODEL on the host reference kernels: raw and dequantized outputs, optionally per layer."""
    info = load_model(model)
    if not inputs:
        raise InputDataError("no --input given", hint="pass --input FILE (one per model input per run)")
    runs = prepare_runs(info, inputs, input_options)
    quantized = [[p.quantized for p in run] for run in runs]
    result = run_reference(model, quantized, per_layer=per_layer, backend=backend)
    cross: list[LayerDisagreement] = []
    if result.backend == "litert" and per_layer and tflm_available():
        cross = compare_backends(model, quantized)
    if save_npy is not None:
        _save_npy(save_npy, result)
    if as_json:
        click.echo(json.dumps(_reference_data(model, info, runs, result, cross), indent=2))
    else:
        console = make_console()
        _print_reference(console, model, info, runs, result, cross, per_layer=per_layer, save_npy=save_npy)
    return int(ExitCode.MATCH)
