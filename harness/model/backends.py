"""Host reference backends, run in-process: what the host-reference child process executes.

Only :mod:`harness.model.hostrun`'s child calls :meth:`ReferenceBackend.run`, :func:`record_arena` and
:func:`run_on_zeros` (a native interpreter can crash or exhaust memory on a corrupted model); the
availability and version checks here import the wheel but run no model. The backends behind
:class:`ReferenceBackend` (``tflm``, ``litert`` with its reference op resolver ``BUILTIN_REF``, ``auto``)
and where each runs: README "Host reference backends and platforms".
"""

from __future__ import annotations

import importlib
import importlib.metadata
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from harness.errors import HostReferenceError, InputDataError, ModelError
from harness.model.loader import ModelInfo
from harness.protocol.spec import crc32

if TYPE_CHECKING:
    from tflite_micro.python.tflite_micro import runtime

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


class ReferenceBackend:
    """A host reference implementation: the package ``dist`` whose interpreter :meth:`load` imports."""

    name: str
    kernels: str
    dist: str
    module: str  # the interpreter's module
    missing: tuple[str, str]  # (what is missing, how to install it), when it cannot be imported

    def load(self) -> ModuleType:
        """Import the interpreter: HostReferenceError when it cannot be (before a child is started)."""
        try:
            # lazy: optional (tflite-micro: Linux x86-64 wheels only), and run only inside the host child;
            # its package first, as `from package import module` does (a package that fails fails it too)
            importlib.import_module(self.module.rpartition(".")[0])
            return importlib.import_module(self.module)
        except ImportError as exc:
            raise HostReferenceError(f"{self.missing[0]} ({exc})", hint=self.missing[1]) from exc

    def version(self) -> str:
        """``dist``'s version from its metadata, without importing it (the TFLM runtime costs 0.04 s of
        CPU, the whole host-reference cost of a cache hit); :meth:`load` (HostReferenceError when the
        backend is missing) only where no metadata says it is installed."""
        try:
            return f"{self.dist} {importlib.metadata.version(self.dist)}"
        except importlib.metadata.PackageNotFoundError:
            self.load()
            return f"{self.dist} (version unknown)"

    def run(
        self, model_bytes: bytes, info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]], per_layer: bool
    ) -> list[ReferenceRun]:
        raise NotImplementedError


_invoke_hook: Callable[[int | None], None] | None = None


def set_invoke_hook(hook: Callable[[int | None], None] | None) -> None:
    """Call ``hook(run)`` just before every Invoke (``run`` None: the zero-input arena probe).

    The host-reference child announces each Invoke on stdout, so that a native abort that follows is
    known to be a kernel's check refusing values (harness.model.hostrun), not a model failing to load.
    """
    global _invoke_hook
    _invoke_hook = hook


def _before_invoke(run: int | None) -> None:
    if _invoke_hook is not None:
        _invoke_hook(run)


def layer_slots(info: ModelInfo) -> list[tuple[int, str, int, str]]:
    """(op index, opcode, tensor index, name) of every op output: the layers a per-layer run lists."""
    return [
        (op.index, op.opcode, t, info.tensors[t].name) for op in info.main_ops for t in op.outputs if t >= 0
    ]


def _layers_from(info: ModelInfo, get: Callable[[int], npt.ArrayLike]) -> list[LayerTensor]:
    layers: list[LayerTensor] = []
    for op_index, opcode, t, name in layer_slots(info):
        arr = np.array(get(t), copy=True)
        tensor = info.tensors[t]
        if arr.shape != tensor.shape and arr.size == tensor.num_elements:
            arr = arr.reshape(tensor.shape)
        layers.append(LayerTensor(op_index, opcode, t, name, arr, crc32(arr)))
    return layers


def host_arena_bytes(info: ModelInfo) -> int:
    """A generous host arena: every non-constant tensor twice, plus per-op and fixed slack.

    Preserving all tensors disables memory reuse, so the tensors alone are a lower bound.
    """
    tensors = sum((t.nbytes + 15) // 16 * 16 for t in info.tensors if not t.is_constant)
    return 2 * tensors + 16 * 1024 * max(1, len(info.ops)) + 1024 * 1024


class TflmBackend(ReferenceBackend):
    """The ``tflite-micro`` wheel (TFLM reference kernels)."""

    name = "tflm"
    kernels = "TFLM reference kernels"
    dist = "tflite-micro"
    module = "tflite_micro.python.tflite_micro.runtime"
    missing = (
        "the TFLM host reference (`tflite-micro` wheel) is not installed or cannot be imported",
        "tflite-micro publishes wheels only for Linux x86-64 (CPython 3.10-3.14): pip install 'esp-check' "
        "there, or use --backend litert (ai-edge-litert reference kernels)",
    )

    def run(
        self, model_bytes: bytes, info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]], per_layer: bool
    ) -> list[ReferenceRun]:
        rt = self.load()
        configs = rt.InterpreterConfig
        config = configs.kPreserveAllTensors if per_layer else configs.kAllocationRecording
        try:
            interp = rt.Interpreter.from_bytes(
                model_bytes, arena_size=host_arena_bytes(info), intrepreter_config=config
            )
        except (RuntimeError, ValueError) as exc:  # TFLM itself refuses the model (allocation, ops)
            raise ModelError(
                f"TFLM's reference interpreter cannot load this model: {str(exc).strip()}",
                hint="TFLM, the library the firmware runs, refuses it with an arena far larger than any "
                "ESP32's: the model is not one TFLM can run (`esp-check inspect MODEL` lists its ops and "
                "tensors); re-export it",
            ) from exc
        except (TypeError, IndexError, OverflowError, struct.error) as exc:  # its Python unpack of the file
            raise ModelError(
                f"TFLM's wheel cannot read this model file ({type(exc).__name__}: {exc})",
                hint="the .tflite file is corrupted: re-export or re-copy it",
            ) from exc
        runs: list[ReferenceRun] = []
        for k, run_inputs in enumerate(inputs):
            try:
                if k:
                    interp.reset()  # every run starts from the same state (stateful models)
                for i, arr in enumerate(run_inputs):
                    interp.set_input(np.ascontiguousarray(arr), i)
                _before_invoke(k)
                interp.invoke()
                outputs = [np.array(interp.get_output(i), copy=True) for i in range(len(info.outputs))]
                layers = (
                    _layers_from(info, lambda t: interp.GetTensor(t, 0)["tensor_data"]) if per_layer else None
                )
            except (RuntimeError, ValueError) as exc:
                raise HostReferenceError(f"TFLM failed on run {k}: {exc}") from exc
            runs.append(ReferenceRun(outputs=outputs, layers=layers))
        return runs


_QDIM_SLOT = 16  # QuantizationParameters.quantized_dimension's vtable offset in the TFLite schema


def litert_compatible(model_bytes: bytes) -> bytes:
    """``model_bytes`` with the one quantization detail LiteRT refuses and TFLM ignores made valid: a 1-D
    tensor's ``quantized_dimension`` set to 0, its only dimension (README "Host reference backends and
    platforms": person_detect's bias tensors say 3); no number changes, other tensors are left as they are.
    """
    import tflite  # lazy: ~25 ms, needed by the LiteRT reference only, not on a repeat run's path

    buf = bytearray(model_bytes)
    model = tflite.Model.GetRootAsModel(buf, 0)
    for s in range(model.SubgraphsLength()):
        sub = model.Subgraphs(s)
        for t in range(sub.TensorsLength()):
            tensor = sub.Tensors(t)
            q = tensor.Quantization()
            slot = q._tab.Offset(_QDIM_SLOT) if q is not None else 0
            if slot and tensor.ShapeLength() == 1 and q.QuantizedDimension() != 0:
                struct.pack_into("<i", buf, q._tab.Pos + slot, 0)
    return bytes(buf)


class LiteRtBackend(ReferenceBackend):
    """``ai-edge-litert`` with the BUILTIN_REF op resolver (reference kernels, no delegates)."""

    name = "litert"
    kernels = "LiteRT reference kernels (BUILTIN_REF)"
    dist = "ai-edge-litert"
    module = "ai_edge_litert.interpreter"
    missing = (
        "the LiteRT host reference (`ai-edge-litert`) is not installed",
        "pip install ai-edge-litert (wheels for Linux, macOS arm64, Windows)",
    )

    def run(
        self, model_bytes: bytes, info: ModelInfo, inputs: Sequence[Sequence[np.ndarray]], per_layer: bool
    ) -> list[ReferenceRun]:
        mod = self.load()
        model_bytes = litert_compatible(model_bytes)
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
            except (RuntimeError, ValueError) as exc:  # the model, not the host: exit 2
                raise ModelError(
                    f"LiteRT rejected the model: {exc}",
                    hint="LiteRT refuses some models TFLM accepts (e.g. a quantization detail TFLM never "
                    "reads); use --backend tflm on Linux x86-64, or re-convert the model",
                ) from exc
            try:
                details_in = interp.get_input_details()
                details_out = interp.get_output_details()
                for i, arr in enumerate(run_inputs):
                    interp.set_tensor(details_in[i]["index"], np.ascontiguousarray(arr))
                _before_invoke(k)
                interp.invoke()
                outputs = [np.array(interp.get_tensor(d["index"]), copy=True) for d in details_out]
                layers = _layers_from(info, interp.get_tensor) if per_layer else None
            except (RuntimeError, ValueError) as exc:
                raise HostReferenceError(f"LiteRT failed on run {k}: {exc}") from exc
            runs.append(ReferenceRun(outputs=outputs, layers=layers))
        return runs


def tflm_installed() -> bool:
    """Whether the tflite-micro wheel is installed (its metadata), without importing it: enough for a
    cache key; :func:`tflm_available` before running it."""
    try:
        importlib.metadata.version("tflite-micro")
    except importlib.metadata.PackageNotFoundError:
        return tflm_available()
    return True


def tflm_available() -> bool:
    """Whether the tflite-micro wheel imports here."""
    try:
        TflmBackend().load()
    except HostReferenceError:
        return False
    return True


def get_backend(name: str = "tflm") -> ReferenceBackend:
    """Backend by name: "tflm", "litert" or "auto" (tflm where installed, else litert).

    "auto" reads the wheel's metadata, not its runtime: a repeat run's cache hit imports no interpreter.
    A tflite-micro wheel that is installed but cannot be imported is then a HostReferenceError that
    says so when the interpreter is needed, not a silent switch to litert."""
    if name == "auto":
        return TflmBackend() if tflm_installed() else LiteRtBackend()
    if name in BACKENDS:
        return {"tflm": TflmBackend, "litert": LiteRtBackend}[name]()
    raise InputDataError(f"unknown reference backend {name!r}", hint=f"use one of {BACKENDS}")


def run_on_zeros(model_bytes: bytes, info: ModelInfo, arena: int) -> runtime.Interpreter:
    """Load ``model_bytes`` into a TFLM interpreter with ``arena`` bytes and invoke it on zeros (also the
    arena probe's confirming run at exactly the measured size)."""
    runtime = TflmBackend().load()
    interp = runtime.Interpreter.from_bytes(model_bytes, arena_size=arena)
    for i, t in enumerate(info.inputs):
        interp.set_input(np.zeros(t.shape, dtype=np.dtype(t.dtype)), i)
    _before_invoke(None)
    interp.invoke()
    return interp


def record_arena(model_bytes: bytes, info: ModelInfo) -> None:
    """Run once in a generous arena and let TFLM's recording allocator print its report
    (``Arena allocation total/head/tail N bytes``), from C++, to the process's fd 2."""
    try:
        interp = run_on_zeros(model_bytes, info, host_arena_bytes(info))
    except (RuntimeError, ValueError) as exc:
        raise HostReferenceError(f"TFLM could not run the model to measure its arena: {exc}") from exc
    sys.stderr.flush()
    interp.print_allocations()
