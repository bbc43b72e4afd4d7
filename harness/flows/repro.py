"""The minimal failing case for an upstream report: one op, its real weights, the input the device read.

What each ``repro/op<K>_<KIND>/`` holds and when it counts as verified: docs/hybrid.md "One-op reproducer".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from harness.errors import EspCheckError
from harness.jsontypes import JSONValue
from harness.model.extract import single_op_model
from harness.model.loader import ModelInfo
from harness.model.reference import run_reference
from harness.model.taps import tapped_inputs
from harness.protocol.capture import Capture


def _dumped(caps: Mapping[str, Capture], variant: str, op: int, role: str) -> dict[int, np.ndarray]:
    """Tensor index -> array of op ``op`` (``role`` in/out) in the first run of ``variant``'s dump capture."""
    cap = caps.get(variant)
    if cap is None or not cap.runs:
        return {}
    return {d.t: d.tensor.data for d in cap.runs[0].dumps if d.idx == op and d.role == role}


def write_reproducer(
    model_path: Path,
    info: ModelInfo,
    op: int,
    caps: Mapping[str, Capture],
    out_dir: Path,
    board: str,
    dump_errors: Sequence[str] = (),
) -> dict[str, JSONValue]:
    """Write ``out_dir/op<K>_<KIND>/`` from the dump captures (``optimized``/``ansi``); returns its summary.

    Which run's captures it takes: docs/hybrid.md "One-op reproducer". Raises nothing: a reproducer that
    cannot be built or does not reproduce is reported as such (``ok: false`` and ``why``, which quotes
    ``dump_errors``: why the dump run has no capture of a build).
    """
    opinfo = info.main_ops[op]
    want = tapped_inputs(info, opinfo)
    ins_opt, ins_ansi = _dumped(caps, "optimized", op, "in"), _dumped(caps, "ansi", op, "in")
    ins, source = (ins_ansi, "ansi") if all(t in ins_ansi for t in want) else (ins_opt, "optimized")
    same_inputs = all(t in ins_opt and t in ins and np.array_equal(ins_opt[t], ins[t]) for t in want)
    summary: dict[str, JSONValue] = {"op": op, "kind": opinfo.opcode, "ok": False, "input_from": source}
    if not want or not all(t in ins for t in want):
        summary["why"] = "the dump run captured no input of this op on either build" + (
            f" ({'; '.join(dump_errors)})" if dump_errors else ""
        )
        return summary
    summary["optimized_read_same_input"] = same_inputs
    outs = [t for t in opinfo.outputs if t >= 0]
    expected = _dumped(caps, "ansi", op, "out").get(outs[0]) if outs else None
    observed = _dumped(caps, "optimized", op, "out").get(outs[0]) if outs and same_inputs else None
    target = out_dir / f"op{op}_{opinfo.opcode}"
    target.mkdir(parents=True, exist_ok=True)
    try:
        one = single_op_model(model_path.read_bytes(), op)
    except EspCheckError as exc:
        summary["why"] = f"cannot cut op {op} out of the model: {exc.message}"
        return summary
    (target / "model.tflite").write_bytes(one)
    files: list[JSONValue] = ["model.tflite"]
    for n, t in enumerate(want):
        np.save(target / f"input_{n}.npy", ins[t])
        files.append(f"input_{n}.npy")
    for name, arr in (("expected_ansi.npy", expected), ("observed_optimized.npy", observed)):
        if arr is not None:
            np.save(target / name, arr)
            files.append(name)
    summary.update(_replay(one, [ins[t] for t in want], expected, observed))
    summary.update(
        dir=str(target), files=files, input_tensors=list(want), output_tensor=outs[0] if outs else None
    )
    (target / "README.md").write_text(_readme(model_path.name, info, op, summary, board), encoding="utf-8")
    (target / "repro.json").write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    return summary


def _replay(
    one: bytes, inputs: list[np.ndarray], expected: np.ndarray | None, observed: np.ndarray | None
) -> dict[str, JSONValue]:
    """The host reference on the one-op model: does it give the ANSI C output, and how far is optimized."""
    out: dict[str, JSONValue] = {}
    try:
        got = np.asarray(run_reference(one, [inputs]).runs[0].outputs[0])
    except EspCheckError as exc:
        return {"why": f"the host reference cannot run the one-op model: {exc.message}"}
    if expected is not None:
        same = got.size == expected.size and bool(np.array_equal(got.reshape(-1), expected.reshape(-1)))
        out["host_equals_ansi"] = same
        out["ok"] = same
        if not same:
            out["why"] = "the host reference of the one-op model does not give the ANSI C build's output"
    if observed is not None and expected is not None and observed.size == expected.size:
        diff = observed.astype(np.int64).reshape(-1) - expected.astype(np.int64).reshape(-1)
        out["optimized_differs"] = int(np.count_nonzero(diff))
        out["optimized_max_lsb"] = int(np.abs(diff).max()) if diff.size else 0
    elif observed is None:
        out["optimized_differs"] = None
        out["note"] = (
            "the optimized build printed no output of this op from the same input (it crashed or hung, or "
            "an earlier culprit changed its input): run the one-op model on the board to see it"
        )
    return out


def _readme(model_name: str, info: ModelInfo, op: int, summary: Mapping[str, JSONValue], board: str) -> str:
    opinfo = info.main_ops[op]
    tensors = summary["input_tensors"]
    n_inputs = len(tensors) if isinstance(tensors, list) else 0
    ins = " ".join(f"--input input_{n}.npy" for n in range(n_inputs))
    diff = (
        f"The optimized build's output differs from ANSI C in {summary['optimized_differs']} element(s), "
        f"at most {summary.get('optimized_max_lsb')} LSB."
        if summary.get("optimized_differs")
        else str(summary.get("note", "The optimized build's output equals ANSI C here."))
    )
    lines = [
        f"# op {op} ({opinfo.opcode}) of {model_name}, on its own",
        "",
        f"`model.tflite` holds only this op with its real weights; `input_*.npy` are its inputs as the "
        f"{summary['input_from']} build read them on the device; `expected_ansi.npy` is what esp-nn's ANSI C "
        "kernel wrote.",
        diff,
        "The host reference (TFLM reference kernels) reproduces the ANSI C output: "
        f"{summary.get('host_equals_ansi')}.",
        "",
        "```sh",
        f"esp-check reference model.tflite {ins}",
    ]
    if n_inputs == 1:
        lines.append(f"esp-check flash-and-compare model.tflite {ins} --board {board}")
    lines += ["```", "", f"Options: {dict(opinfo.options)}", ""]
    return "\n".join(lines)
