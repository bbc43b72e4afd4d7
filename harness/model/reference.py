"""Host reference: run a model with reference kernels and return raw outputs (and every layer).

Backends (one small interface, :class:`ReferenceBackend`):

- ``tflm`` (default): the ``tflite-micro`` wheel, i.e. TFLM's own reference kernels, the ones
  ESP-NN's optimized kernels are supposed to match. Linux x86-64 only.
- ``litert``: ``ai-edge-litert`` with its *reference* op resolver (``BUILTIN_REF``), which was
  bit-exact with TFLM on every fixture model; never LiteRT's default optimized kernels or XNNPACK
  (they differ from TFLM by up to 43 LSB). Wheels exist for macOS, Windows and Linux.
- ``auto``: ``tflm`` where importable, else ``litert``.

Models are validated with :func:`harness.model.loader.load_model` before any native code sees them, and
the TFLM arena is sized generously from the tensor sizes (a too-small arena can crash the wheel).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.errors import HostReferenceError, InputDataError, ModelError
from harness.model.loader import ModelInfo, TensorInfo, parse_model_bytes
from harness.protocol.spec import crc32

BACKENDS = ("tflm", "litert", "auto")


@dataclass(frozen=True)
class LayerTensor:
    """One intermediate (op output) tensor after an invoke."""

    op_index: int
    opcode: str
    tensor_index: int
    name: str
    array: np.ndarray  # raw values, model dtype and shape
    crc32: int  # zlib.crc32 of array.tobytes()

    @property
    def crc32_hex(self) -> str:
        return f"{self.crc32:08X}"


@dataclass(frozen=True)
class ReferenceRun:
    """Outputs of one invoke (one set of model inputs)."""

    outputs: list[np.ndarray]
    layers: list[LayerTensor] | None = None


@dataclass(frozen=True)
class ReferenceResult:
    """All runs of one model on one backend, with what produced them."""

    backend: str
    backend_version: str  # e.g. "tflite-micro 0.dev20261023182759"
    runs: list[ReferenceRun]
    model_sha256: str = ""
    kernels: str = ""  # e.g. "TFLM reference kernels"


class ReferenceBackend(Protocol):
    """What a host reference implementation provides."""

    name: str
    kernels: str

    def version(self) -> str: ...

    def run(
        self, model_bytes: bytes, info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]], per_layer: bool
    ) -> list[ReferenceRun]: ...


def _dist_version(dist: str) -> str:
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} (version unknown)"


def _layers_from(info: ModelInfo, get: Any) -> list[LayerTensor]:
    layers: list[LayerTensor] = []
    for op in info.main_ops:
        for t in op.outputs:
            if t < 0:
                continue
            arr = np.array(get(t), copy=True)
            tensor = info.tensors[t]
            if arr.shape != tensor.shape and arr.size == tensor.num_elements:
                arr = arr.reshape(tensor.shape)
            layers.append(
                LayerTensor(op.index, op.opcode, t, tensor.name, arr, crc32(arr))
            )
    return layers


def host_arena_bytes(info: ModelInfo) -> int:
    """A generous host arena: every non-constant tensor twice, plus per-op and fixed slack.

    Preserving all tensors disables memory reuse, so the tensors alone are a lower bound.
    """
    tensors = sum((t.nbytes + 15) // 16 * 16 for t in info.tensors if not t.is_constant)
    return 2 * tensors + 16 * 1024 * max(1, len(info.ops)) + 1024 * 1024


class TflmBackend:
    """The ``tflite-micro`` wheel (TFLM reference kernels)."""

    name = "tflm"
    kernels = "TFLM reference kernels"

    @staticmethod
    def _runtime() -> Any:
        try:
            from tflite_micro.python.tflite_micro import runtime
        except ImportError as exc:
            raise HostReferenceError(
                "the TFLM host reference (`tflite-micro` wheel) is not installed or cannot be imported"
                f" ({exc})",
                hint="tflite-micro publishes wheels only for Linux x86-64 (CPython 3.10-3.14): "
                "pip install 'esp-check' there, or use --backend litert (ai-edge-litert reference kernels)",
            ) from exc
        return runtime

    def version(self) -> str:
        self._runtime()
        return _dist_version("tflite-micro")

    def run(
        self, model_bytes: bytes, info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]], per_layer: bool
    ) -> list[ReferenceRun]:
        rt = self._runtime()
        config = (
            rt.InterpreterConfig.kPreserveAllTensors
            if per_layer
            else rt.InterpreterConfig.kAllocationRecording
        )
        try:
            interp = rt.Interpreter.from_bytes(
                model_bytes, arena_size=host_arena_bytes(info), intrepreter_config=config
            )
        except (RuntimeError, ValueError) as exc:
            raise HostReferenceError(f"TFLM could not load the model: {exc}") from exc
        runs: list[ReferenceRun] = []
        for k, run_inputs in enumerate(inputs):
            try:
                if k:
                    interp.reset()  # every run starts from the same state (stateful models)
                for i, arr in enumerate(run_inputs):
                    interp.set_input(np.ascontiguousarray(arr), i)
                interp.invoke()
                outputs = [np.array(interp.get_output(i), copy=True) for i in range(len(info.outputs))]
                layers = (
                    _layers_from(info, lambda t: interp.GetTensor(t, 0)["tensor_data"]) if per_layer else None
                )
            except (RuntimeError, ValueError) as exc:
                raise HostReferenceError(f"TFLM failed on run {k}: {exc}") from exc
            runs.append(ReferenceRun(outputs=outputs, layers=layers))
        return runs


class LiteRtBackend:
    """``ai-edge-litert`` with the BUILTIN_REF op resolver (reference kernels, no delegates)."""

    name = "litert"
    kernels = "LiteRT reference kernels (BUILTIN_REF)"

    @staticmethod
    def _module() -> Any:
        try:
            from ai_edge_litert import interpreter
        except ImportError as exc:
            raise HostReferenceError(
                f"the LiteRT host reference (`ai-edge-litert`) is not installed ({exc})",
                hint="pip install ai-edge-litert (wheels for Linux, macOS arm64, Windows)",
            ) from exc
        return interpreter

    def version(self) -> str:
        self._module()
        return _dist_version("ai-edge-litert")

    def run(
        self, model_bytes: bytes, info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]], per_layer: bool
    ) -> list[ReferenceRun]:
        mod = self._module()
        runs: list[ReferenceRun] = []
        for k, run_inputs in enumerate(inputs):
            try:
                # A fresh interpreter per run: same starting state, like TFLM's reset().
                interp = mod.Interpreter(
                    model_content=model_bytes,
                    experimental_op_resolver_type=mod.OpResolverType.BUILTIN_REF,
                    experimental_preserve_all_tensors=per_layer,
                )
                interp.allocate_tensors()
            except (RuntimeError, ValueError) as exc:
                raise HostReferenceError(
                    f"LiteRT rejected the model: {exc}",
                    hint="LiteRT refuses some older models TFLM accepts (e.g. invalid bias quantization); "
                    "use --backend tflm on Linux x86-64",
                ) from exc
            try:
                details_in = interp.get_input_details()
                details_out = interp.get_output_details()
                for i, arr in enumerate(run_inputs):
                    interp.set_tensor(details_in[i]["index"], np.ascontiguousarray(arr))
                interp.invoke()
                outputs = [np.array(interp.get_tensor(d["index"]), copy=True) for d in details_out]
                layers = _layers_from(info, interp.get_tensor) if per_layer else None
            except (RuntimeError, ValueError) as exc:
                raise HostReferenceError(f"LiteRT failed on run {k}: {exc}") from exc
            runs.append(ReferenceRun(outputs=outputs, layers=layers))
        return runs


def tflm_available() -> bool:
    """Whether the tflite-micro wheel imports here."""
    try:
        TflmBackend._runtime()
    except HostReferenceError:
        return False
    return True


def get_backend(name: str = "tflm") -> ReferenceBackend:
    """Backend by name: "tflm", "litert" or "auto" (tflm where importable, else litert)."""
    if name == "auto":
        return TflmBackend() if tflm_available() else LiteRtBackend()
    if name == "tflm":
        return TflmBackend()
    if name == "litert":
        return LiteRtBackend()
    raise InputDataError(f"unknown reference backend {name!r}", hint=f"use one of {BACKENDS}")


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
        arrays: list[np.ndarray] = []
        for arr, tensor in zip(run, info.inputs, strict=True):
            a = np.asarray(arr)
            _check_one(a, tensor, k)
            arrays.append(np.ascontiguousarray(a))
        checked.append(arrays)
    return checked


def _check_one(a: np.ndarray, tensor: TensorInfo, run: int) -> None:
    if a.dtype != np.dtype(tensor.dtype) or tuple(a.shape) != tensor.shape:
        raise InputDataError(
            f"run {run}: input for {tensor.name!r} is {a.dtype} {list(a.shape)}, the model needs "
            f"{tensor.dtype} {list(tensor.shape)}",
            hint="prepare inputs with harness.model.inputs.load_input "
            "(it quantizes with the model's scale/zero point)",
        )


def run_reference(
    model: Path | str | bytes,
    inputs: Sequence[Sequence[np.ndarray]],
    *,
    per_layer: bool = False,
    backend: str = "tflm",
) -> ReferenceResult:
    """Run ``model`` once per entry of ``inputs`` (runs x model inputs, quantized arrays).

    Returns raw outputs (model dtype and shape) and, with ``per_layer``, every op output tensor
    with its CRC32. Raises ModelError for unreadable models, InputDataError for inputs that do
    not fit, HostReferenceError when the backend is missing or fails.
    """
    if isinstance(model, (bytes, bytearray)):
        data = bytes(model)
        info = parse_model_bytes(data)
    else:
        p = Path(model)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read model file {p}: {exc.strerror or exc}") from exc
        info = parse_model_bytes(data, p)
    checked = _check_inputs(info, inputs)
    impl = get_backend(backend)
    version = impl.version()
    runs = impl.run(data, info, checked, per_layer)
    for k, run in enumerate(runs):
        if len(run.outputs) != len(info.outputs):
            raise HostReferenceError(
                f"{impl.name}: run {k} gave {len(run.outputs)} outputs, the model has {len(info.outputs)}"
            )
        for o, (arr, tensor) in enumerate(zip(run.outputs, info.outputs, strict=True)):
            if arr.dtype != np.dtype(tensor.dtype) or arr.size != tensor.num_elements:
                raise HostReferenceError(
                    f"{impl.name}: run {k} output {o} is {arr.dtype} {list(arr.shape)}, expected "
                    f"{tensor.dtype} {list(tensor.shape)}"
                )
            if arr.shape != tensor.shape:
                run.outputs[o] = arr.reshape(tensor.shape)
    return ReferenceResult(
        backend=impl.name, backend_version=version, runs=runs, model_sha256=info.sha256, kernels=impl.kernels
    )


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

    def to_dict(self) -> dict[str, object]:
        return {
            "run": self.run,
            "op_index": self.op_index,
            "opcode": self.opcode,
            "tensor_index": self.tensor_index,
            "name": self.name,
            "mismatched": self.mismatched,
            "max_abs_diff": self.max_abs_diff,
        }


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
            out.append(
                LayerDisagreement(
                    k,
                    la.op_index,
                    la.opcode,
                    la.tensor_index,
                    la.name,
                    int(np.count_nonzero(diff)),
                    int(diff.max()),
                )
            )
    return out
