"""Fault injection for the simulated board: parsed from the ``sim://`` URL or a board file's dict.

Every fault is deterministic given ``seed``: the random choices (which elements, where a line is cut,
which bits flip) come from ``random.Random`` seeded with (seed, fault name, boot count) only.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from harness.errors import UsageError

# name -> one-line description (docs/simulator.md has the long form)
FAULTS: dict[str, str] = {
    "corrupt": "some output elements off by `corrupt_lsb` LSB (like the ESP-NN bug)",
    "pinned": "every output element pinned at the dtype minimum (-128 for int8)",
    "panic": "Guru Meditation panic during invoke (Xtensa with Backtrace, RISC-V with MEPC/MTVAL)",
    "abort": "abort() during invoke, then reboot",
    "hang": "silence after the INPUT record (invoke never returns)",
    "bootloop": "the app asserts during start-up (no RAM left for the main task's stack) on every boot",
    "brownout": "brownout detector triggers during invoke, then reboots",
    "noise": "bit flips in the console output at rate `noise` per bit",
    "truncate": "output stops in the middle of the records (no END)",
    "disconnect": "the port disconnects in the middle of the records",
    "sync_fail": "the first `fault_count` download-mode sessions do not answer SYNC",
    "baud_fail": "the line garbles what the host sends above the app's console baud (a USB-UART bridge "
    "that cannot run the fast link): the BAUD switch must fall back",
    "wdt": "task watchdog message spliced into a record line",
    "alloc": "AllocateTensors fails: ERROR stage=alloc",
    "op_corrupt": "op `fault_op` writes `fault_region` of its output off by `corrupt_lsb` LSB",
    "op_clobber": "an input of op `fault_op` is overwritten (`fault_region`) after its producer finished, "
    "as by another op's scratch-buffer overflow",
    # the resident loop's streaming path (docs/protocol.md "Resident loop")
    "frame_rx": "every `frame_every`-th command frame the device receives has a damaged byte",
    "frame_tx": "every `frame_every`-th frame the device sends has a damaged byte",
    "stall": "the device stops answering after `fault_count` RUN commands (a stalled device)",
    "flaky": "every second invoke changes one output element by 1 LSB (a non-deterministic kernel)",
    "op_panic": "Guru Meditation panic inside op `fault_op` (where that op runs the `variant_fault` kernel)",
    "op_hang": "the invoke never returns once op `fault_op` starts (where it runs the `variant_fault` one)",
    "unoptimized_kind": "op kind `fault_kind` compiled without ESP-NN optimization in the optimized build: "
    "the same outputs at ANSI C speed",
}

# faults that act on single ops (fault_op=K or K1,K2,...): in a hybrid image only where op K runs the
# kernel of `variant_fault` (an op sent to ANSI C no longer runs the faulty optimized kernel)
OP_FAULTS = ("op_corrupt", "op_clobber", "op_panic", "op_hang")

OP_REGIONS = ("last_row", "last_col", "first_row", "first_col", "border", "random", "all")

VARIANTS = ("optimized", "ansi")


@dataclass(frozen=True)
class FaultSpec:
    """Faults to inject. ``variant`` limits app-level faults to images of that variant."""

    names: frozenset[str] = frozenset()
    variant: str | None = None
    seed: int = 1
    corrupt_lsb: int = 3
    corrupt_frac: float = 0.1
    noise: float = 1e-4
    fault_count: int = 1
    loops: int = 3
    fault_boots: int | None = None  # app faults only on the first N app boots of the board (transient)
    extra: Mapping[str, str] = field(default_factory=dict)
    fault_ops: tuple[int, ...] = ()  # op faults: the op indices (fault_op=17 or fault_op=17,27)
    fault_region: str = "last_row"
    frame_every: int = 5  # frame_rx / frame_tx: which frames are damaged
    fault_kind: str | None = None  # unoptimized_kind: the op kind, e.g. CONV_2D

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
        return _norm_variant(image_variant) == self.variant

    def rng(self, name: str, boot: int) -> random.Random:
        return random.Random(f"{self.seed}:{name}:{boot}")


def _norm_variant(v: str) -> str:
    v = v.strip().lower()
    return "ansi" if v in ("ansi", "ansi_c") else v


def parse_faults(params: Mapping[str, str | int | float | list[str]]) -> FaultSpec:
    """Build a :class:`FaultSpec` from URL query parameters or a board file's ``[sim]`` table."""

    def one(key: str) -> str | None:
        v = params.get(key)
        if v is None:
            return None
        if isinstance(v, list):
            return ",".join(str(x) for x in v)
        return str(v)

    names: set[str] = set()
    raw = one("fault")
    if raw:
        for part in raw.replace("+", ",").split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in FAULTS:
                raise UsageError(
                    f"unknown simulator fault {part!r}",
                    hint=f"known faults: {', '.join(sorted(FAULTS))}",
                )
            names.add(part)
    variant = one("variant_fault")
    if variant is not None:
        variant = _norm_variant(variant)
        if variant not in VARIANTS:
            raise UsageError(f"variant_fault={variant!r} is not a variant", hint="use optimized or ansi")

    def num(key: str, default: float, kind: type = float) -> float:
        v = one(key)
        if v is None:
            return default
        try:
            return float(kind(v))
        except ValueError:
            raise UsageError(f"simulator parameter {key}={v!r} is not a number") from None

    fault_op = one("fault_op")
    parts = [p.strip() for p in (fault_op or "").split(",")]
    if fault_op is not None and not all(p.isdigit() for p in parts):
        raise UsageError(f"fault_op={fault_op!r} is not an op index (or a list)", hint="e.g. fault_op=17,27")
    if names & set(OP_FAULTS) and fault_op is None:
        raise UsageError(f"{'/'.join(OP_FAULTS)} need fault_op=<op index>", hint="e.g. fault_op=17")
    kind = one("fault_kind")
    if "unoptimized_kind" in names and not kind:
        raise UsageError("unoptimized_kind needs fault_kind=<op kind>", hint="e.g. fault_kind=CONV_2D")
    region = (one("fault_region") or "last_row").strip().lower()
    if region not in OP_REGIONS:
        raise UsageError(
            f"fault_region={region!r} is not a region", hint=f"use one of {', '.join(OP_REGIONS)}"
        )
    return FaultSpec(
        fault_ops=tuple(sorted({int(p) for p in parts})) if fault_op is not None else (),
        fault_region=region,
        fault_kind=kind.strip().upper() if kind else None,
        names=frozenset(names),
        variant=variant,
        seed=int(num("seed", 1, int)),
        corrupt_lsb=int(num("corrupt_lsb", 3, int)),
        corrupt_frac=float(num("corrupt_frac", 0.1)),
        noise=float(num("noise", 1e-4)),
        fault_count=int(num("fault_count", 1, int)),
        loops=int(num("loops", 3, int)),
        fault_boots=None if one("fault_boots") is None else int(num("fault_boots", 0, int)),
        frame_every=max(1, int(num("frame_every", 5, int))),
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
    import math

    return math.log(1.0 - x) if x < 1.0 else -math.inf
