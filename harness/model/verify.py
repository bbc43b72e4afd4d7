"""Structural check of a whole .tflite flatbuffer before any interpreter is handed it.

Flatbuffers in Python do not verify their input, and neither does TFLM: its C++ reads offsets as it
finds them, and the ``tflite-micro`` wheel first unpacks *every* table of the model (signature
defs, metadata, sparsity, every option table) into Python objects. A corrupted file then ends in a
TypeError, a struct.error, a loop over a vector that claims two billion elements, or a crash.

:func:`verify_structure` reads every field the ``tflite`` schema package knows (generic, by
reflection over its generated accessors, like a flatbuffers verifier driven by the schema):

- every vector's element count must fit in the file before it is iterated (a huge length is a
  corrupted length);
- every table, string and scalar vector must lie inside the file (the accessors raise otherwise);
- nesting is bounded (no .tflite nests deeper than a few tables; deeper means cyclic offsets), and
  so is the number of tables visited (shared or cyclic offsets cannot make the walk explode).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from harness.errors import ModelError

if TYPE_CHECKING:
    import tflite

MAX_DEPTH = 10
# union field -> the schema's enum naming its table types
_UNIONS = {
    "BuiltinOptions": "BuiltinOptions",
    "BuiltinOptions2": "BuiltinOptions2",
    "Details": "QuantizationDetails",
    "ArrayIndices": "SparseIndexVector",
    "ArraySegments": "SparseIndexVector",
}
_SUFFIXES = ("IsNone", "Length", "AsNumpy", "BufferHasIdentifier", "Type")


def _fields(cls: type) -> tuple[tuple[str, str], ...]:
    """(accessor, kind) of a generated table class; kind: "vector", "numpy", "union" or "value"."""
    out: list[tuple[str, str]] = []
    for name in sorted(vars(cls)):
        if name.startswith(("_", "GetRootAs", "Init")) or (
            name.endswith(_SUFFIXES) and not (name.endswith("Type") and name[:-4] not in _UNIONS)
        ):
            continue
        if name in _UNIONS and hasattr(cls, name + "Type"):
            out.append((name, "union"))
        elif hasattr(cls, name + "AsNumpy"):
            out.append((name, "numpy"))
        elif hasattr(cls, name + "Length"):
            out.append((name, "vector"))
        else:
            out.append((name, "value"))
    return tuple(out)


class _Walk:
    def __init__(self, tfl: ModuleType, size: int) -> None:
        self.tfl = tfl
        self.size = size
        self.budget = size // 4 + 4096  # every table needs at least 4 bytes of its own
        self.kinds: dict[type, tuple[tuple[str, str], ...]] = {}  # _fields of each table class met

    def table(self, obj: object, where: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ModelError(f"{where}: tables nested deeper than any .tflite model (cyclic offsets)")
        self.budget -= 1
        if self.budget < 0:
            raise ModelError(f"{where}: more tables than fit in the file (shared or cyclic offsets)")
        cls = type(obj)
        if cls not in self.kinds:
            self.kinds[cls] = _fields(cls)
        for name, kind in self.kinds[cls]:
            here = f"{where}.{name}"
            if kind == "numpy":
                if getattr(obj, name + "Length")():
                    getattr(obj, name + "AsNumpy")()  # np.frombuffer raises past the end of the file
            elif kind == "vector":
                self.vector(obj, name, here, depth)
            elif kind == "union":
                self.union(obj, name, here, depth)
            else:
                value = getattr(obj, name)()
                if hasattr(value, "_tab"):
                    self.table(value, here, depth + 1)

    def vector(self, obj: object, name: str, where: str, depth: int) -> None:
        n = int(getattr(obj, name + "Length")())
        if n * 4 > self.size:  # tables and strings take a 4-byte offset each
            raise ModelError(f"{where}: a vector of {n} elements cannot fit in a {self.size}-byte file")
        get = getattr(obj, name)
        for j in range(n):
            item = get(j)
            if hasattr(item, "_tab"):
                self.table(item, f"{where}[{j}]", depth + 1)

    def union(self, obj: object, name: str, where: str, depth: int) -> None:
        code = int(getattr(obj, name + "Type")())
        if code == 0:
            return
        names = {v: k for k, v in vars(getattr(self.tfl, _UNIONS[name])).items() if isinstance(v, int)}
        cls = getattr(self.tfl, names.get(code, ""), None)
        table = getattr(obj, name)()
        if cls is None or table is None:
            return  # a type this schema does not know: TFLM reports it as an unsupported option
        inner = cls()
        inner.Init(table.Bytes, table.Pos)
        self.table(inner, f"{where}<{cls.__name__}>", depth + 1)


def verify_structure(tfl: ModuleType, model: tflite.Model, size: int) -> None:
    """Read every table, vector and string of ``model`` once; raise ModelError (or the accessor's
    struct.error / ValueError / TypeError, which the loader turns into one) where it is broken."""
    _Walk(tfl, size).table(model, "model", 0)
