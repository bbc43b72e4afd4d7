"""Host reference: run a model with reference kernels and return raw outputs (and every layer).

The backends live in :mod:`harness.model.backends` and run only in the child process of
:mod:`harness.model.hostrun`. Models are validated with :func:`harness.model.loader.parse_model_bytes`
before any native code sees them, and the TFLM arena is sized generously from the tensor sizes (a
too-small arena can crash the wheel).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import HostReferenceError, InputDataError, ReferenceRefusedError
from harness.model.backends import ReferenceResult, get_backend
from harness.model.hostrun import host_results
from harness.model.inputs import InputOptions, load_input
from harness.model.loader import ModelInfo, parse_model_bytes, read_model


def _check_inputs(info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    if len(inputs) == 0:
        raise InputDataError("no inputs given to the host reference", hint="pass at least one --input")
    checked: list[list[np.ndarray]] = []
    for k, run in enumerate(inputs):
        if len(run) != len(info.inputs):
            raise InputDataError(
                f"run {k}: {len(run)} input array(s) given, the model has {len(info.inputs)} input(s) "
                f"({', '.join(t.name for t in info.inputs)})"
            )
        arrays = [np.asarray(a) for a in run]
        for a, tensor in zip(arrays, info.inputs, strict=True):
            if a.dtype != np.dtype(tensor.dtype) or tuple(a.shape) != tensor.shape:
                raise InputDataError(
                    f"run {k}: input for {tensor.name!r} is {a.dtype} {list(a.shape)}, the model needs "
                    f"{tensor.dtype} {list(tensor.shape)}",
                    hint="prepare inputs with harness.model.inputs.load_input "
                    "(it quantizes with the model's scale/zero point)",
                )
        checked.append([np.ascontiguousarray(a) for a in arrays])
    return checked


def run_reference(
    model: Path | str | bytes,
    inputs: Sequence[Sequence[np.ndarray]],
    *,
    per_layer: bool = False,
    backend: str = "tflm",
    stop: threading.Event | None = None,
) -> ReferenceResult:
    """Run ``model`` once per entry of ``inputs`` (runs x model inputs, quantized arrays).

    Returns raw outputs (model dtype and shape) and, with ``per_layer``, every op output tensor
    with its CRC32. Raises ModelError for unreadable models, InputDataError for inputs that do
    not fit, HostReferenceError when the backend is missing or fails (or ``stop`` is set, from
    another thread: its child is killed).
    """
    data, info = _read_model(model)
    checked = _check_inputs(info, inputs)
    impl = get_backend(backend)
    result = host_results(data, info, checked, backend=impl.name, per_layer=per_layer, stop=stop).reference
    assert result is not None
    for k, run in enumerate(result.runs):  # (one output per model output: hostrun reads them so)
        for o, (arr, tensor) in enumerate(zip(run.outputs, info.outputs, strict=True)):
            if arr.dtype != np.dtype(tensor.dtype) or arr.size != tensor.num_elements:
                raise HostReferenceError(
                    f"{impl.name}: run {k} output {o} is {arr.dtype} {list(arr.shape)}, expected "
                    f"{tensor.dtype} {list(tensor.shape)}"
                )
            if arr.shape != tensor.shape:
                run.outputs[o] = arr.reshape(tensor.shape)
    return result


def _read_model(model: Path | str | bytes) -> tuple[bytes, ModelInfo]:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model), parse_model_bytes(bytes(model))
    return read_model(model)


def prepare_host_results(
    model: Path | str,
    input_paths: Sequence[Path | str],
    *,
    input_options: InputOptions | None = None,
    backend: str = "auto",
    per_layer: bool = False,
) -> None:
    """Run the reference on the inputs and TFLM's arena probe in ONE child, so that the arena
    estimate (``generate``), the reference leg of the comparison and the simulated board all read
    the cache afterwards. Only for one-input models (as the comparison); others probe the arena only.

    Raises ModelError when the model crashes the interpreter; a missing or failing backend, or a
    reference that refuses the values (ReferenceRefusedError), is left for the stages that need it.
    """
    data, info = _read_model(model)
    runs: list[list[np.ndarray]] = []
    if len(info.inputs) == 1 and input_paths:
        runs = [[load_input(p, info.inputs[0], input_options).quantized] for p in input_paths]
    with contextlib.suppress(HostReferenceError, ReferenceRefusedError):  # (the stages that need it say it)
        name = get_backend(backend).name
        host_results(data, info, runs, backend=name, per_layer=per_layer, reference=bool(runs), arena=True)


@dataclass(frozen=True)
class LayerDisagreement:
    """One op output where two backends differ (listed by op, never hidden)."""

    run: int
    op_index: int
    opcode: str
    tensor_index: int
    name: str
    mismatched: int
    max_abs_diff: int


def compare_backends(
    model: Path | str | bytes,
    inputs: Sequence[Sequence[np.ndarray]],
    a: str = "tflm",
    b: str = "litert",
) -> list[LayerDisagreement]:
    """Run both backends per layer and list every op output that differs (empty = bit-exact)."""
    ra = run_reference(model, inputs, per_layer=True, backend=a)
    rb = run_reference(model, inputs, per_layer=True, backend=b)
    out: list[LayerDisagreement] = []
    for k, (run_a, run_b) in enumerate(zip(ra.runs, rb.runs, strict=True)):
        for la, lb in zip(run_a.layers or [], run_b.layers or [], strict=True):
            if la.crc32 == lb.crc32 and np.array_equal(la.array, lb.array):
                continue
            diff = np.abs(la.array.astype(np.int64) - lb.array.astype(np.int64))
            mismatched, worst = int(np.count_nonzero(diff)), int(diff.max())
            row = LayerDisagreement(
                k, la.op_index, la.opcode, la.tensor_index, la.name, mismatched, max_abs_diff=worst
            )
            out.append(row)
    return out
