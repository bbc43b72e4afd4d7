"""Fault injection for the simulated board: parsed from the ``sim://`` URL or a board file's dict.

Every fault is deterministic given ``seed``: the random choices (which elements, where a line is cut,
which bits flip) come from ``random.Random`` seeded with (seed, fault name, boot count) only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Annotated

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from harness.errors import UsageError
from harness.flashfmt.partitions import VARIANTS
from harness.manifest import VARIANT_OF_NN
from harness.userfiles import field_path, problem, validated

# faults that act on single ops (fault_op=K or K1,K2,...): in a hybrid image only where op K runs the
# kernel of `variant_fault` (an op sent to ANSI C no longer runs the faulty optimized kernel)
OP_FAULTS = ("op_corrupt", "op_clobber", "op_panic", "op_hang")

# every fault name a URL or a board file may give, by what it acts on (docs/simulator.md "Faults" says
# what each one does)
_APP_FAULTS = ("corrupt", "pinned", "panic", "abort", "hang", "bootloop", "brownout", "alloc", "flaky")
_SERIAL_FAULTS = ("noise", "truncate", "disconnect", "wdt", "sync_fail", "baud_fail")  # the serial link
_STREAM_FAULTS = ("frame_rx", "frame_tx", "stall")  # the resident loop's streaming path
KEEP_FAULTS = ("keep_cold", "keep_stale", "keep_flip", "keep_lost")  # the kept-input store in PSRAM
FAULTS = (*_APP_FAULTS, *_SERIAL_FAULTS, *_STREAM_FAULTS, *KEEP_FAULTS, *OP_FAULTS, "unoptimized_kind")

OP_REGIONS = ("last_row", "last_col", "first_row", "first_col", "border", "random", "all")


def blank_is_none(value: object) -> object:
    """A URL's ``key=`` (empty) as not given."""
    return None if value == "" else value


class FaultParams(BaseModel):
    """The fault parameters of a ``sim://`` URL or a board file's ``[sim]`` table (docs/simulator.md).

    Values may be text (a URL's query) and are converted; unknown keys are errors.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: str | None = Field(None, description="fault names joined by ',' or '+'")
    variant_fault: str | None = Field(None, description="app faults only in this variant: optimized | ansi")
    seed: int = Field(1, ge=0)
    corrupt_lsb: int = 3
    corrupt_frac: float = Field(0.1, ge=0, le=1)
    noise: float = Field(1e-4, ge=0, le=1, description="bit-flip rate per console bit")
    fault_count: int = Field(1, ge=0)
    fault_boots: Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(blank_is_none)] = None
    loops: int = Field(3, ge=0)
    fault_op: str | None = Field(None, description="op index, or a list: 17,27")
    fault_region: str = Field("last_row", json_schema_extra={"enum": list(OP_REGIONS)})
    frame_every: int = Field(5, ge=1)
    fault_kind: str | None = Field(None, description="unoptimized_kind: the op kind, e.g. CONV_2D")


@dataclass(frozen=True)
class FaultSpec:
    """Faults to inject (:func:`parse_faults` makes one from :class:`FaultParams`). ``variant`` limits
    app-level faults to images of that variant."""

    names: frozenset[str]
    variant: str | None
    seed: int
    corrupt_lsb: int
    corrupt_frac: float
    noise: float
    fault_count: int
    loops: int
    fault_boots: int | None  # app faults only on the first N app boots (transient)
    fault_ops: tuple[int, ...]  # op faults: the op indices (fault_op=17 or fault_op=17,27)
    fault_region: str
    frame_every: int  # frame_rx / frame_tx: which frames are damaged
    fault_kind: str | None  # unoptimized_kind: the op kind, e.g. CONV_2D

    @property
    def fault_op(self) -> int | None:
        """The first faulty op (the only one unless several were given)."""
        return self.fault_ops[0] if self.fault_ops else None

    def for_boot(self, boot_index: int) -> FaultSpec:
        """The faults in force on app boot ``boot_index`` (1-based): none once ``fault_boots`` are used up.

        ``sync_fail`` is a download-mode fault with its own budget (``fault_count``) and stays.
        """
        if self.fault_boots is None or boot_index <= self.fault_boots:
            return self
        return replace(self, names=frozenset(n for n in self.names if n == "sync_fail"))

    def active(self, name: str, image_variant: str | None = None) -> bool:
        """Whether fault ``name`` applies (app faults only to the chosen variant, if one is set)."""
        if name not in self.names:
            return False
        if name in ("sync_fail",) or self.variant is None or image_variant is None:
            return True
        return norm_variant(image_variant.strip()) == self.variant

    def rng(self, name: str, boot: int) -> random.Random:
        return random.Random(f"{self.seed}:{name}:{boot}")


def norm_variant(v: str) -> str:
    """A variant name, or the ESP-NN mode it reports (``ansi_c``), as the variant name."""
    v = v.lower()
    return VARIANT_OF_NN.get(v, v)


def sim_params_error(model: type[BaseModel], exc: ValidationError) -> UsageError:
    """A sim:// URL's or [sim] table's first bad parameter, named, as a UsageError (exit 2)."""
    unknown = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    if unknown:
        return UsageError(
            f"unknown simulator parameter(s): {', '.join(sorted(unknown))}",
            hint=f"known: {', '.join(sorted(model.model_fields))}",
        )
    loc, msg, _ = problem(exc, model)
    name = field_path(loc)[0]
    return UsageError(f"simulator parameter {name} {msg}", hint="see docs/simulator.md for every parameter")


def parse_faults(params: Mapping[str, str]) -> FaultSpec:
    """Build a :class:`FaultSpec` from a ``sim://`` URL's query (a board file's ``[sim]`` table becomes one:
    :func:`harness.sim.url_for`)."""
    given = {k: v for k, v in params.items() if k in FaultParams.model_fields}
    p = validated(FaultParams, given, partial(sim_params_error, FaultParams))
    names: set[str] = set()
    for part in (p.fault or "").replace("+", ",").split(","):
        part = part.strip().lower()
        if not part:
            continue
        if part not in FAULTS:
            raise UsageError(
                f"unknown simulator fault {part!r}", hint=f"known faults: {', '.join(sorted(FAULTS))}"
            )
        names.add(part)
    variant = None if p.variant_fault is None else norm_variant(p.variant_fault.strip())
    if variant is not None and variant not in VARIANTS:
        raise UsageError(
            f"variant_fault={variant!r} is not a variant", hint=f"use one of {', '.join(VARIANTS)}"
        )
    parts = [x.strip() for x in (p.fault_op or "").split(",")]
    if p.fault_op is not None and not all(x.isdigit() for x in parts):
        raise UsageError(
            f"fault_op={p.fault_op!r} is not an op index (or a list)", hint="e.g. fault_op=17,27"
        )
    if names & set(OP_FAULTS) and p.fault_op is None:
        raise UsageError(f"{'/'.join(OP_FAULTS)} need fault_op=<op index>", hint="e.g. fault_op=17")
    if "unoptimized_kind" in names and not p.fault_kind:
        raise UsageError("unoptimized_kind needs fault_kind=<op kind>", hint="e.g. fault_kind=CONV_2D")
    region = p.fault_region.strip().lower()
    if region not in OP_REGIONS:
        raise UsageError(
            f"fault_region={region!r} is not a region", hint=f"use one of {', '.join(OP_REGIONS)}"
        )
    return FaultSpec(
        fault_ops=tuple(sorted({int(x) for x in parts})) if p.fault_op is not None else (),
        fault_region=region,
        fault_kind=p.fault_kind.strip().upper() if p.fault_kind else None,
        names=frozenset(names),
        variant=variant,
        **p.model_dump(exclude={"fault", "variant_fault", "fault_op", "fault_region", "fault_kind"}),
    )


def flip_bits(data: bytes, rate: float, rng: random.Random) -> bytes:
    """Flip each bit with probability ``rate`` (deterministic for a given rng state)."""
    if rate <= 0 or not data:
        return data
    out = bytearray(data)
    nbits = len(out) * 8
    # geometric gaps between flips: O(flips), not O(bits)
    pos = -1
    while True:
        u = rng.random()
        gap = 1 if rate >= 1 else int(_log1p_neg(u) / _log1p_neg(rate)) + 1
        pos += gap
        if pos >= nbits:
            break
        out[pos // 8] ^= 1 << (pos % 8)
    return bytes(out)


def _log1p_neg(x: float) -> float:
    return math.log(1.0 - x) if x < 1.0 else -math.inf


def bump_lsb(a: np.ndarray, mask: np.ndarray, lsb: int) -> np.ndarray:
    """a + lsb where masked (a - lsb, towards the middle of the range, where + lsb would leave it)."""
    out = np.array(a, copy=True)
    if out.dtype.kind in "iu":
        lim = np.iinfo(out.dtype)
        wide = out.astype(np.int64)
        fits = (wide + lsb <= lim.max) & (wide + lsb >= lim.min)
        wide = np.where(mask, np.where(fits, wide + lsb, wide - lsb), wide)
        return wide.astype(out.dtype)
    return np.where(mask, out + lsb, out).astype(out.dtype)
