"""Per-op behaviour of the simulated chip for ``--tap`` firmware and op-level faults.

The ops run from the host per-layer reference; how op faults change them and how the change is
propagated to later ops: docs/simulator.md "Where the runner, tap records and hybrid firmware plug in".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.model.loader import ModelInfo, OpInfo
from harness.model.taps import tapped_inputs
from harness.sim.cycles import Dispatch, op_cycles
from harness.sim.faults import bump_lsb


@dataclass(frozen=True)
class OpFault:
    """Where an op fault is injected: kind (``op_corrupt``, ``op_clobber``, ``op_panic``, ``op_hang``), op
    index (plus ``more_ops``), region; ``variant``: the kernel that is faulty (None: both)."""

    kind: str
    op: int
    region: str = "last_row"
    lsb: int = 3
    frac: float = 0.1
    seed: int = 1
    more_ops: tuple[int, ...] = ()
    variant: str | None = None

    def hits(self, op: int, dispatch: Dispatch) -> bool:
        """The fault fires at op ``op`` of an image with this dispatch (a faulty optimized kernel is
        not run where the hybrid table sends the op to ANSI C, and vice versa)."""
        if op != self.op and op not in self.more_ops:
            return False
        return self.variant is None or dispatch.kernel(op) == self.variant


@dataclass(frozen=True)
class SimOp:
    """What the tap wrapper sees for one op: (t, array) read before and written after the invoke."""

    op: OpInfo
    inputs: tuple[tuple[int, np.ndarray], ...]
    outputs: tuple[tuple[int, np.ndarray], ...]
    cycles: int


def region_mask(shape: tuple[int, ...], region: str, rng: random.Random, frac: float) -> np.ndarray:
    """Boolean mask of ``region`` in an NHWC-like tensor (rows = axis -3, columns = axis -2)."""
    mask = np.zeros(shape, dtype=bool)
    nd = len(shape)
    row_ax = nd - 3 if nd >= 3 else (0 if nd == 2 else None)
    col_ax = nd - 2 if nd >= 2 else 0
    # the (axis, index) slices that make each region up (axis None: the whole tensor)
    picks: dict[str, list[tuple[int | None, int]]] = {"last_row": [(row_ax, -1)], "first_row": [(row_ax, 0)]}
    picks |= {"last_col": [(col_ax, -1)], "first_col": [(col_ax, 0)], "all": [(None, 0)]}
    picks["border"] = [(ax, k) for ax in {row_ax, col_ax} - {None} for k in (0, -1)]
    if nd == 0:
        mask[...] = True
    elif region in picks:
        for axis, k in picks[region]:
            idx: list[slice | int] = [slice(None)] * nd
            if axis is not None:
                idx[axis] = k
            mask[tuple(idx)] = True
    else:  # random
        flat = mask.reshape(-1)
        k = max(1, round(flat.size * frac))
        flat[rng.sample(range(flat.size), min(k, flat.size))] = True
    return mask


def simulate_ops(
    info: ModelInfo,
    model_input: np.ndarray,
    layers: dict[int, np.ndarray],
    variant: str | Dispatch,
    fault: OpFault | None,
    cycles: Sequence[int] | None = None,
) -> tuple[list[SimOp], dict[int, np.ndarray]]:
    """Run the graph op by op over the reference tensors, applying ``fault`` where it hits.

    ``layers`` maps tensor index -> reference array for every op output; ``variant`` is the image's
    variant or its per-op :class:`Dispatch`; ``cycles`` the modelled cycles per op (default: the
    ESP32-S3 model of :mod:`harness.sim.cycles`). Returns the tap view of every op and the final value
    of every tensor (model outputs included).
    """
    dispatch = variant if isinstance(variant, Dispatch) else Dispatch(variant)
    cyc = list(cycles) if cycles is not None else op_cycles(info, "esp32s3", dispatch)
    values: dict[int, np.ndarray] = {t.index: np.asarray(model_input) for t in info.inputs[:1]}
    producer = {t: o.index for o in info.main_ops for t in o.outputs if t >= 0}
    clobbered: int | None = None
    if (
        fault is not None
        and fault.kind == "op_clobber"
        and 0 <= fault.op < len(info.main_ops)
        and fault.hits(fault.op, dispatch)
    ):
        # the produced input of op k whose producer ran longest ago is overwritten in between
        cands = [t for t in tapped_inputs(info, info.main_ops[fault.op]) if t in producer]
        clobbered = min(cands, key=lambda t: producer[t]) if cands else None
    changed: set[int] = set()
    ops: list[SimOp] = []
    for op in info.main_ops:
        reads = []
        for t in tapped_inputs(info, op):
            arr = values.get(t)
            if arr is None:
                arr = layers[t]
            if fault is not None and op.index == fault.op and t == clobbered:
                rng = random.Random(f"{fault.seed}:op_clobber:{t}")
                arr = bump_lsb(arr, region_mask(arr.shape, fault.region, rng, fault.frac), fault.lsb)
                values[t] = arr
                changed.add(t)
            reads.append((t, arr))
        tainted = any(t in changed for t, _ in reads)
        writes = []
        for t in op.outputs:
            if t < 0:
                continue
            ref = layers[t]
            arr = ref
            if fault is not None and fault.kind == "op_corrupt" and fault.hits(op.index, dispatch):
                rng = random.Random(f"{fault.seed}:op_corrupt:{t}")
                arr = bump_lsb(ref, region_mask(ref.shape, fault.region, rng, fault.frac), fault.lsb)
                changed.add(t)
            elif tainted:
                rng = random.Random(f"{fault.seed if fault else 1}:propagate:{t}")
                mask = region_mask(ref.shape, "random", rng, 0.05)
                arr = bump_lsb(ref, mask, 1)
                changed.add(t)
            values[t] = arr
            writes.append((t, arr))
        ops.append(SimOp(op, tuple(reads), tuple(writes), cyc[op.index] if op.index < len(cyc) else 0))
    return ops, values
