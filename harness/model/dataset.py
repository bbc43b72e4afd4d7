"""Datasets for ``flash-and-compare --dataset`` / ``--random-inputs`` (docs/dataset.md).

A dataset is a list of inputs, each already in the model's input tensor format (the bytes the host
streams to the resident firmware), with an optional label. Its sources, the ``--labels`` file and the
class list that maps label names to output indices are docs/dataset.md's options table and "Class names".
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.errors import InputDataError
from harness.model.files import INPUT_MAX_BYTES, MiB, check_regular, read_regular
from harness.model.inputs import (
    C_SUFFIXES,
    IMAGE_SUFFIXES,
    RAW_SUFFIXES,
    InputOptions,
    load_input,
    prepare_array,
    tensor_bytes,
)
from harness.model.loader import TensorInfo
from harness.protocol.frames import prng_bytes

MAX_ITEMS = 100_000
DATASET_MAX_BYTES = 1024 * MiB  # an .npz of MAX_ITEMS inputs
INPUT_SUFFIXES = (*IMAGE_SUFFIXES, ".npy", *RAW_SUFFIXES, *(s for s in C_SUFFIXES if s != ".txt"))


@dataclass(frozen=True)
class DatasetItem:
    """One input: a name for reports, the input tensor bytes, its label (class name or index) if known."""

    name: str
    data: bytes
    label: str | None = None


@dataclass
class Dataset:
    items: list[DatasetItem]
    source: str  # what the user named (path, or "random")
    seed: int | None = None  # random inputs: the PRNG seed (the device draws them)
    classes: list[str] = field(default_factory=list)  # label names in index order (empty: integer labels)

    @property
    def random(self) -> bool:
        return self.seed is not None

    def __len__(self) -> int:
        return len(self.items)

    def label_index(self, item: DatasetItem) -> int | None:
        """The class index of ``item``'s label (None without a label)."""
        if item.label is None:
            return None
        if item.label in self.classes:
            return self.classes.index(item.label)
        return int(item.label)


def random_dataset(n: int, seed: int, tensor: TensorInfo) -> Dataset:
    """``n`` inputs from the device's PRNG with ``seed`` (the host's bit-exact replica)."""
    if not 1 <= n <= MAX_ITEMS:
        raise InputDataError(f"--random-inputs {n}: give 1 to {MAX_ITEMS} inputs")
    if not 0 <= seed < 1 << 64:
        raise InputDataError(f"--seed {seed}: give an unsigned 64-bit integer")
    items = [DatasetItem(f"random#{i}", prng_bytes(seed, i, tensor.dtype, tensor.nbytes)) for i in range(n)]
    return Dataset(items, "random", seed)


def load_dataset(
    path: str | Path,
    tensor: TensorInfo,
    options: InputOptions | None = None,
    labels: str | Path | None = None,
    classes: Sequence[str] | None = None,
) -> Dataset:
    """The dataset at ``path`` (directory, .npz or .txt list), each input prepared for ``tensor``.

    ``classes``: the class names in output index order, for labels that are names; without it, a
    ``classes.txt`` in or beside the dataset is read (see the module docstring)."""
    src = Path(path)
    if src.is_dir():
        ds = _from_directory(src, tensor, options)
    elif src.suffix.lower() == ".npz":
        ds = _from_npz(src, tensor, options)
    elif src.suffix.lower() in (".txt", ".lst", ".list"):
        ds = _from_list(src, tensor, options)
    else:
        raise InputDataError(
            f"--dataset {src}: not a directory, .npz or .txt list"
            + ("" if src.exists() else " (it does not exist)"),
            hint="give a folder of inputs (a sub-folder per class for labels), an .npz, or a list of paths",
        )
    if not ds.items:
        hint = (
            f"input files end in {', '.join(INPUT_SUFFIXES)}"
            if src.is_dir()
            else _stack_hint(tensor)
            if src.suffix.lower() == ".npz"
            else "list one input file per line (optionally followed by ,<label>)"
        )
        raise InputDataError(f"--dataset {src} holds no inputs", hint=hint)
    if len(ds.items) > MAX_ITEMS:
        raise InputDataError(f"--dataset {src} holds {len(ds.items)} inputs; at most {MAX_ITEMS}")
    if labels is not None:
        _apply_labels(ds, Path(labels))
    _index_classes(ds, src, classes)
    return ds


def _from_directory(root: Path, tensor: TensorInfo, options: InputOptions | None) -> Dataset:
    # not only regular files: a FIFO or device named like an input is refused by load_input, not skipped
    files = sorted(p for p in root.rglob("*") if not p.is_dir() and p.suffix.lower() in INPUT_SUFFIXES)
    per_class = any(p.parent != root for p in files)
    items = []
    for p in files:
        rel = p.relative_to(root)
        label = rel.parts[0] if per_class and len(rel.parts) > 1 else None
        items.append(DatasetItem(rel.as_posix(), tensor_bytes(load_input(p, tensor, options)), label))
    return Dataset(items, str(root))


_X_KEYS = ("x", "inputs", "images")
_Y_KEYS = ("y", "labels")


def _from_npz(path: Path, tensor: TensorInfo, options: InputOptions | None) -> Dataset:
    check_regular(path, what="dataset", max_bytes=DATASET_MAX_BYTES, error=InputDataError)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise InputDataError(f"{path}: not a readable .npz file: {exc}") from exc
    xkey = next((k for k in _X_KEYS if k in arrays), None)
    if xkey is None and len(arrays) == 1 and next(iter(arrays)) not in _Y_KEYS:  # a sole array: the inputs
        xkey = next(iter(arrays))
    if xkey is None:
        keys = ", ".join(sorted(arrays))
        labels_only = bool(arrays) and set(arrays) <= set(_Y_KEYS)
        raise InputDataError(
            f"{path}: holds labels ({keys}) but no inputs"
            if labels_only
            else f"{path}: which array holds the inputs? keys: {keys}"
            if arrays
            else f"{path}: an empty .npz (no arrays)",
            hint=f"name the inputs one of {', '.join(_X_KEYS)} (and the labels {' or '.join(_Y_KEYS)})",
        )
    x = arrays[xkey]
    if x.ndim < 1:
        raise InputDataError(
            f"{path}: {xkey} is a single value, not a list of inputs", hint=_stack_hint(tensor, xkey)
        )
    ykey = next((k for k in _Y_KEYS if k in arrays), None)
    y = arrays[ykey] if ykey is not None else None
    if y is not None and (y.ndim < 1 or len(y) != len(x)):
        raise InputDataError(
            f"{path}: {xkey} holds {len(x)} inputs but {ykey} "
            + (f"holds {len(y)} labels" if y.ndim else "is a single value"),
            hint=f"give one label per input ({ykey} of shape ({len(x)},)), or leave {ykey} out",
        )
    items = []
    for i in range(len(x)):
        prep = prepare_array(x[i], tensor, options, source=f"{path.name}[{i}]")
        label = None if y is None else str(y[i].item() if hasattr(y[i], "item") else y[i])
        items.append(DatasetItem(f"{path.name}[{i}]", tensor_bytes(prep), label))
    return Dataset(items, str(path))


def _stack_hint(tensor: TensorInfo, key: str = "x") -> str:
    """How an .npz holds a dataset's inputs, for the model's input shape."""
    shape = ", ".join(str(n) for n in tensor.shape)
    return f"stack the inputs along a first axis: {key} of shape (N, {shape}) for N inputs, N >= 1"


def _from_list(path: Path, tensor: TensorInfo, options: InputOptions | None) -> Dataset:
    items = []
    for n, line in enumerate(_read_text(path, "dataset list").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, label = (part.strip() for part in line.partition(","))
        p = (path.parent / name).resolve()
        if not p.is_file():
            raise InputDataError(
                f"{path} line {n}: {name} does not exist (looked for {p})",
                hint=f"a relative path is taken from the list's folder ({path.parent}): correct the path or "
                "drop the line",
            )
        items.append(DatasetItem(name, tensor_bytes(load_input(p, tensor, options)), label or None))
    return Dataset(items, str(path))


def _read_text(path: Path, what: str) -> str:
    data = read_regular(path, what=what, max_bytes=INPUT_MAX_BYTES, error=InputDataError)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputDataError(f"{what} {path} is not UTF-8 text ({exc})") from None


def _apply_labels(dataset: Dataset, path: Path) -> None:
    """Labels by input name from a CSV (``name,label``) or JSON (``{name: label}``) file."""
    text = _read_text(path, "--labels file")
    mapping: dict[str, str] = {}
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise InputDataError(f"--labels {path}: not JSON ({exc})") from exc
        if not isinstance(doc, dict) or not all(isinstance(v, (str, int)) for v in doc.values()):
            raise InputDataError(f"--labels {path}: expected an object mapping input names to labels")
        mapping = {str(k): str(v) for k, v in doc.items()}
    else:
        for row in csv.reader(text.splitlines()):
            key = row[0].strip() if len(row) >= 2 else ""
            header = not mapping and key.lower() in ("name", "file")  # a first row naming the columns
            if key and not header:
                mapping[key] = row[1].strip()
    hits = 0
    for k, item in enumerate(dataset.items):
        label = mapping.get(item.name, mapping.get(Path(item.name).name))
        if label is not None:
            dataset.items[k] = DatasetItem(item.name, item.data, label)
            hits += 1
    if hits == 0:
        raise InputDataError(
            f"--labels {path} names none of the dataset's {len(dataset.items)} inputs",
            hint="use the input file names (or paths relative to the dataset directory) as keys",
        )
    missing = [it.name for it in dataset.items if it.label is None]
    if missing:  # accuracy over the labelled part only would read as the whole dataset's
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise InputDataError(
            f"--labels {path} gives no label for {len(missing)} of the dataset's {len(dataset.items)} inputs "
            f"({shown}): the accuracy would count only the others",
            hint="label every input (by file name, or path relative to the dataset directory)",
        )


CLASSES_FILE = "classes.txt"


def _classes_file(src: Path) -> Path | None:
    """``classes.txt`` in the dataset folder, else beside the dataset (folder or file)."""
    candidates = ((src / CLASSES_FILE) if src.is_dir() else None, src.parent / CLASSES_FILE)
    return next((c for c in candidates if c is not None and c.exists()), None)


def read_classes(path: Path) -> list[str]:
    """Class names in output index order: one per line, ``#`` comments and blank lines skipped."""
    names = [ln.strip() for ln in _read_text(path, "class list").splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    dup = sorted({n for n in names if names.count(n) > 1})
    if not names or dup:
        raise InputDataError(
            f"class list {path}: " + (f"{dup[0]!r} is listed twice" if dup else "names no class"),
            hint="one class name per line, in the model's output order (line 1 = output 0)",
        )
    return names


def _index_classes(dataset: Dataset, src: Path, classes: Sequence[str] | None) -> None:
    """Which output index each label is: integers are indices; names need the class list."""
    labels = sorted({it.label for it in dataset.items if it.label is not None})
    names = [lb for lb in labels if not lb.isdigit()]  # the rest are class indices
    if not names:
        return  # integer class indices (a folder per index: 0/, 1/, ...)
    where = _classes_file(src) if classes is None else None
    if classes is None and where is None:
        raise InputDataError(
            f"--dataset {src}: the labels are class names ({', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}), but which output of the model is each?",
            hint=f"write {CLASSES_FILE} in the dataset folder or beside the dataset: the class names, "
            "one per line, in output order (line 1 = output 0); or name the folders (labels) by index",
        )
    listed = list(classes) if classes is not None else read_classes(where) if where else []
    unknown = [n for n in names if n not in listed]
    if unknown:
        raise InputDataError(
            f"--dataset {src}: label {unknown[0]!r} is not in the class list "
            f"({where or 'classes='}: {', '.join(listed[:8])}{', ...' if len(listed) > 8 else ''})",
            hint="rename the folder (label) to a class of the list, or add the class to the list "
            "at its output index",
        )
    bad = [lb for lb in labels if lb.isdigit() and int(lb) >= len(listed)]
    if bad:
        raise InputDataError(
            f"--dataset {src}: label {bad[0]} is past the class list's {len(listed)} classes"
        )
    dataset.classes = listed
