"""The tables the generated firmware's ``--tap`` op wrapper needs, as Jinja context (docs/tap.md).

Which tensors each op reads and writes (the rule of :mod:`harness.model.taps`), their sizes and shapes,
which ops to dump and the wrapper's RAM overhead. The orchestrator decides *whether* to tap (plain
data: :class:`harness.firmware.generate.FirmwareFeatures`); this module only lays the tables out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from harness.errors import GenerateError
from harness.model.loader import ModelInfo
from harness.model.taps import tapped_inputs, tapped_outputs
from harness.protocol.spec import DTYPES, TAP_MAX_TENSORS, TAP_RECORD_BYTES


def tap_firmware_context(
    info: ModelInfo, *, tap: bool, dump_ops: Sequence[int] = ()
) -> dict[str, Any] | None:
    """Template context for the op wrapper (None when neither --tap nor --dump-ops is asked for)."""
    dump = sorted({int(k) for k in dump_ops})
    if not tap and not dump:
        return None
    ops = list(info.main_ops)
    if info.subgraph_count > 1:
        raise GenerateError(
            "--tap supports models with one subgraph (control-flow ops run other subgraphs)",
            hint="run without --tap",
        )
    bad = [k for k in dump if not 0 <= k < len(ops)]
    if bad:
        raise GenerateError(
            f"--dump-ops {','.join(map(str, bad))}: the model has ops 0..{len(ops) - 1}",
            hint="`esp-check inspect MODEL` lists the ops with their indices",
        )
    for op in ops:
        if op.opcode == "CUSTOM" and not op.custom_code:
            raise GenerateError(f"op {op.index} is a custom op without a name: cannot tap it")
    keys = [str(op.custom_code if op.opcode == "CUSTOM" else op.opcode) for op in ops]
    kinds = list(dict.fromkeys(keys))
    tensors: dict[int, dict[str, Any]] = {}
    op_rows: list[dict[str, Any]] = []
    for op, key in zip(ops, keys, strict=True):
        ins, outs = tapped_inputs(info, op), tapped_outputs(op)
        for t in ins + outs:
            ti = info.tensors[t]
            if ti.dtype not in DTYPES:  # what an OPDATA record can carry
                raise GenerateError(
                    f"op {op.index} ({op.opcode}) uses tensor {t} of dtype {ti.dtype}: --tap can dump "
                    f"only {', '.join(DTYPES)}",
                    hint="run without --tap",
                )
            if t not in tensors:
                tensors[t] = {
                    "t": t,
                    "shape": list(ti.shape),
                    "bytes": int(ti.nbytes),
                    "dtype": ti.dtype,
                    "scale": float(ti.scale or 0.0),
                    "zero_point": int(ti.zero_point or 0),
                }
        op_rows.append(
            {
                "index": op.index,
                "opcode": op.opcode,
                "kind": kinds.index(key),
                # what OP op= prints: the protocol allows [A-Za-z0-9_-], at most 32 bytes
                "record_name": re.sub(r"[^A-Za-z0-9_-]", "_", key)[:32] or "-",
                "ins": ins,
                "outs": outs,
            }
        )
    order = sorted(tensors)
    slot = {t: k for k, t in enumerate(order)}
    for row in op_rows:
        row["in_slots"] = ([slot[t] for t in row["ins"]] + [0] * TAP_MAX_TENSORS)[:TAP_MAX_TENSORS]
        row["out_slots"] = ([slot[t] for t in row["outs"]] + [0] * TAP_MAX_TENSORS)[:TAP_MAX_TENSORS]
    dumps = []
    offset = 0
    for k in dump:
        row = op_rows[k]
        for role, side in (("in", row["ins"]), ("out", row["outs"])):
            for t in side:
                dumps.append({"op": k, "slot": slot[t], "t": t, "role": role, "offset": offset})
                offset += (tensors[t]["bytes"] + 3) // 4 * 4
    records_ram = TAP_RECORD_BYTES * len(ops)
    manifest = {
        "enabled": bool(tap or dump),
        "dump_ops": dump,
        "record_bytes": TAP_RECORD_BYTES,
        "max_ops": len(ops),
        "records_ram_bytes": records_ram,
        "dump_ram_bytes": offset,
        "ram_bytes": records_ram + offset,
    }
    return {
        "kinds": [
            {"name": kd, "builtin": kd if any(o["opcode"] == kd for o in op_rows) else None} for kd in kinds
        ],
        "ops": op_rows,
        "tensors": [tensors[t] for t in order],
        "dumps": dumps,
        "dump_bytes": offset,
        "manifest": manifest,
    }
