"""Classify what a board printed: crashes, resets, power, boot-mode and link problems.

``classify(raw)`` returns :class:`Finding` objects from a table of detectors (:data:`DETECTORS`). How it
reads damaged serial text (squeezed anchors, bounded scans: serial input is hostile, nothing is
evaluated), the kinds, their evidence and exit codes (:data:`KIND_TABLE`): docs/device.md,
"Classification".
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import ClassVar

import numpy as np

from harness.analysis import sanitizer as san
from harness.chips import strap_pin
from harness.errors import ExitCode, ModelError, combine_exit_codes
from harness.model.opdata import resolver_method
from harness.protocol.capture import MARKER, Capture, evidence_text, parse_capture
from harness.protocol.frames import MAGIC as FRAME_MAGIC
from harness.protocol.frames import split_stream
from harness.resources import data_dir, parse_toml

__all__ = [
    "DETECTORS",
    "KINDS",
    "KIND_TABLE",
    "SEVERITY_EXIT",
    "BootCounter",
    "Detector",
    "Finding",
    "KindInfo",
    "Severity",
    "classify",
    "exit_code_for",
]


class Severity(str, enum.Enum):
    """How a finding counts; the value is what reports print."""

    FIRMWARE_FAULT = "firmware_fault"  # exit 4
    INFRASTRUCTURE = "infrastructure"  # exit 3
    USAGE = "usage"  # exit 2 (protocol ERROR stage=input: what was embedded is wrong)
    WARNING = "warning"  # reported, no exit code of its own


SEVERITY_EXIT: dict[str, ExitCode | None] = {
    Severity.FIRMWARE_FAULT: ExitCode.FIRMWARE_FAULT,
    Severity.INFRASTRUCTURE: ExitCode.INFRASTRUCTURE,
    Severity.USAGE: ExitCode.USAGE,
    Severity.WARNING: None,
}


@dataclasses.dataclass(frozen=True)
class KindInfo:
    """One kind of finding and its default severity (what it is recognised by: docs/device.md)."""

    kind: str
    severity: str


_FW, _INFRA = Severity.FIRMWARE_FAULT, Severity.INFRASTRUCTURE

# Pure data: every kind classify() can report and its severity; what each kind is recognised by is the
# table in docs/device.md, "Classification". boot_loop's severity follows its cause.
KIND_TABLE: tuple[KindInfo, ...] = tuple(
    KindInfo(kind, severity)
    for severity, kinds in (
        (_FW, ("panic", "interrupt_watchdog", "stack_overflow", "heap_corruption", "abort", "alloc_failure")),
        (_FW, ("arena_too_small", "missing_op", "tflm_error", "schema_mismatch", "sanitizer", "native_exit")),
        (_FW, ("firmware_error", "hang", "boot_loop")),
        (_INFRA, ("model_partition", "unknown", "brownout", "boot_failure", "download_mode", "silence")),
        (_INFRA, ("no_end", "disconnect", "link_repair", "corrupted")),
        (Severity.USAGE, ("input_error", "flash_size_mismatch")),
        (Severity.WARNING, ("task_watchdog",)),
    )
    for kind in kinds
)
KINDS: dict[str, str] = {k.kind: k.severity for k in KIND_TABLE}


# What a finding read from the capture: numbers, names, addresses (values from hostile input: narrow
# with isinstance before use).
Details = dict[str, object]


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    severity: str
    message: str
    line: int | None = None  # 1-based line of the first evidence line in the decoded capture
    evidence: tuple[str, ...] = ()
    details: Mapping[str, object] = dataclasses.field(default_factory=dict)
    hint: str | None = None  # what to do about it

    @property
    def exit_code(self) -> ExitCode | None:
        return SEVERITY_EXIT[self.severity]

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {**vars(self), "evidence": list(self.evidence)}
        if not self.hint:
            del out["hint"]
        return out


def exit_code_for(findings: Iterable[Finding]) -> ExitCode | None:
    """The exit code the findings alone imply (None when there are only warnings or nothing)."""
    codes = [f.exit_code for f in findings if f.exit_code is not None]
    return combine_exit_codes(codes) if codes else None


# --- boots ---------------------------------------------------------------------------------------


# The ROM banner (`ets Jul 29 2019 12:21:46`, `ESP-ROM:esp32c3-api1-20210207`), also spliced after
# other text or with its first letters lost.
_ROM_BANNER = re.compile(
    r"(?:ets|ts|\bs) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} (?:19|20)\d\d\b"
    r"|-ROM:\s*esp32",
    re.IGNORECASE,
)
_ROM_BOOT = re.compile(r"0x[0-9a-fA-F]{1,2} ?\([A-Z0-9_]{2,}\), ?boot:0x[0-9a-fA-F]{1,2}")
_BOOTLOADER = re.compile(r"ESP-IDF \S+.* 2nd stage bootloader")


class BootCounter:
    """Counts boot starts from several independent signals and reports the largest count (why, and
    which signals: docs/device.md, "Counting boots")."""

    SIGNALS: ClassVar[dict[str, re.Pattern[str]]] = {
        "rom_rst": re.compile(r"rst:0x[0-9a-fA-F]+ ?\("),
        # the rest of the ROM's reset line, when a splice or a lost start took `rst:`
        "rom_boot": _ROM_BOOT,
        "rom_banner": _ROM_BANNER,
        "bootloader": _BOOTLOADER,
        "app_start": re.compile(r"ro cpu start user code"),
        "main_task": re.compile(r"ain_task: Started on CPU0"),
        "begin": re.compile(re.escape(MARKER.decode()) + "0 BEGIN "),
    }

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(self.SIGNALS, 0)

    def feed(self, line: bytes | str) -> None:
        text = line.decode("latin-1") if isinstance(line, bytes) else line
        for name, pat in self.SIGNALS.items():
            if pat.search(text):
                self.counts[name] += 1

    @property
    def count(self) -> int:
        return max(self.counts.values())


# --- decoded lines -------------------------------------------------------------------------------

_LINE_CAP = 2000  # characters of one line that are looked at (real lines are < 300)
_EVIDENCE_CAP = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SQUEEZE = re.compile(r"[^a-z0-9]+")
# monitor prefixes: [12:34:56], [12:34:56.789], 12:34:56.789 -> , 12:34:56.789 > , [19:05:50:673],
# [2024-02-20T14:56:44Z INFO ], mail/markdown quotes
_PREFIX = re.compile(
    r"^(?:\s*(?:\[\d{1,2}:\d{2}:\d{2}(?:[.:]\d{1,3})?\]|\d{1,2}:\d{2}:\d{2}\.\d{3}\s*-?>"
    r"|\[\d{4}-\d\d-\d\dT[\d:.]+Z?\s*[A-Z]*\s*\]|>(?=\s|$)))+\s?"
)
# lines a monitor's backtrace decoder added (idf.py monitor, ESPHome, PlatformIO, espflash)
_DECODER = re.compile(
    r"^\s*(?:---\s+)?0x[0-9a-fA-F]{8}\s*(?::\s|-\s)|^\s*(?:WARNING\s+)?Decoded\s+0x|^\s*#\d+\s+0x[0-9a-fA-F]{8}"
    r"|^\s+at\s+\S|^\s*\(inlined by\)|^\s*--- (?:Warning|WARNING|Error|idf_monitor|esp-idf-monitor|Quit)"
)
_RST = re.compile(r"rst\s*:?\s*0x([0-9a-fA-F]{1,2})\s*\(?\s*([A-Z0-9_]*)", re.IGNORECASE)
_BOOT_MODE = re.compile(r"boot\s*:?\s*0x([0-9a-fA-F]{1,2})\s*\(\s*([^\r\n]{0,60})")
_CRASH_END = ("rebooting", "cpuhalted", "rebootingsystem")


@dataclasses.dataclass(frozen=True)
class _Line:
    text: str  # ANSI colours stripped, cut to _LINE_CAP
    body: str  # monitor prefixes stripped
    sq: str  # lower-case letters and digits only: survives lost separators, junk bytes, backticks
    decoded: bool  # added by a monitor's backtrace decoder: never a headline of its own


def _line(raw_line: str) -> _Line:
    ln = raw_line.rstrip("\r")[:_LINE_CAP]
    body = _PREFIX.sub("", ln, count=1)
    return _Line(ln, body, _SQUEEZE.sub("", ln.lower()), bool(_DECODER.search(body)))


class _Lines:
    """The capture's lines, each decoded (prefix, squeeze, decoder mark) only when a detector looks at it:
    a 25 MB log has ~700,000 lines, and the detectors read the few near evidence (``_Ctx.hot``)."""

    def __init__(self, raw_lines: list[str]) -> None:
        self._raw = raw_lines
        self._cache: dict[int, _Line] = {}

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i: int) -> _Line:
        ln = self._cache.get(i)
        if ln is None:
            ln = self._cache[i] = _line(self._raw[i])
        return ln


def _text(raw: bytes | str) -> str:
    text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text.replace("\r\n", "\n")


class _Ctx:
    """The decoded capture plus which lines a finding already explains."""

    def __init__(self, raw: bytes | str, parsed: Capture | None) -> None:
        text = _text(raw)
        self.lines = _Lines(text.split("\n"))
        self.parsed = parsed
        # the lines that may start evidence (a superset of every detector's anchors, see _hot_lines):
        # the detectors look only at these and the lines near them
        self.hot: Sequence[int] = _hot_lines(text)
        self.claimed: dict[int, str] = {}  # line index -> kind of the crash report it belongs to
        self.explained: set[int] = set()  # lines of non-crash findings (TFLM, alloc texts, watchdog dumps)
        self.has_end = _has_end(text)  # an END record in the text
        # anything but blanks and NULs (the exact per-line rule when the quick search finds nothing)
        self.printed = bool(_PRINTED.search(text)) or any(
            self.lines[i].text.strip().strip("\x00") for i in range(min(len(self.lines), 100_000))
        )

    def unclaimed(self) -> Iterator[tuple[int, _Line]]:
        """The hot lines (index, line) that no crash report has claimed when the loop reaches them."""
        for i in self.hot:
            if i not in self.claimed:
                yield i, self.lines[i]

    def has(self, i: int, anchors: Sequence[str]) -> bool:
        ln = self.lines[i]
        return not ln.decoded and _hit(ln.sq, anchors)

    def crash_end(self, start: int, limit: int = 80) -> int:
        """Last line of the crash report starting at ``start``: up to the next boot or ``Rebooting...``."""
        n = len(self.lines)
        for j in range(start + 1, min(n, start + limit)):
            ln = self.lines[j]
            if _is_boot_start(ln):
                return j - 1
            if not ln.decoded and _SQUEEZE.sub("", ln.body.lower()) in _CRASH_END:
                return j
        return min(n, start + limit) - 1

    def claim(self, start: int, end: int, kind: str) -> None:
        for j in range(start, end + 1):
            self.claimed.setdefault(j, kind)

    def finding(
        self,
        i: int,
        kind: str,
        message: str,
        details: Details,
        hint: str | None = None,
        end: int | None = None,
    ) -> tuple[int, Finding]:
        """A finding of ``kind`` (its severity from KIND_TABLE) whose evidence is lines ``i`` to ``end``."""
        stop = i if end is None else end
        last = min(stop + 1, i + 12, len(self.lines))
        evidence = tuple(self.lines[j].text[:_EVIDENCE_CAP] for j in range(i, last))
        return i, Finding(
            kind, KINDS[kind], message, line=i + 1, evidence=evidence, details=details, hint=hint
        )


def _is_boot_start(line: _Line) -> bool:
    return bool(
        _ROM_BANNER.search(line.text)
        or (_RST.search(line.text) and "rst0x" in line.sq)
        or _ROM_BOOT.search(line.text)
        or _BOOTLOADER.search(line.text)
    )


def _hit(squeezed: str, anchors: Sequence[str]) -> bool:
    """Whether a squeezed line holds an anchor, also when the anchor's first character was lost.

    Anchors are squeezed phrases (``"corruptheap"``); the first character of a line is the one a UART
    most often loses, and it is usually the first character of the phrase that starts the line.
    """
    return any(a[1:] in squeezed for a in anchors)


Found = Iterator[tuple[int, Finding]]


@dataclasses.dataclass(frozen=True)
class Detector:
    """One family of evidence: the kinds it reports and the function that finds them."""

    name: str
    kinds: tuple[str, ...]
    run: Callable[[_Ctx], Found]


# --- crash details -------------------------------------------------------------------------------

_HEX = r"0x[0-9a-fA-F]{8}"
_REGS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (key, re.compile(pat + r"\s*:?\s*(" + _HEX + ")"))
    for key, pat in (
        ("pc", r"\bPC"),
        ("excvaddr", r"EXCVADDR"),
        ("exccause", r"EXCCAUSE"),
        ("mepc", r"MEPC"),
        ("mtval", r"MTVAL"),
        ("mcause", r"MCAUSE"),
        ("ra", r"\bRA"),
    )
)
_BT_PAIR = re.compile(r"0x([0-9a-fA-F]{8}):0x([0-9a-fA-F]{8})")
_CORE = re.compile(r"Core\s*(\d)", re.IGNORECASE)
# ESP-IDF >= 3: `Core 0 panic'ed (LoadProhibited)`; before 2017: `Guru Meditation Error of type
# LoadProhibited occurred on core 0`
_REASON = re.compile(
    r"panic'?\W?ed\s*\(([^)\r\n]{1,100})\)?|of\s*type\s+(\w{2,40})\s+occurred", re.IGNORECASE
)


def _reason(text: str) -> str | None:
    m = _REASON.search(text)
    return (m.group(1) or m.group(2)).strip()[:120] if m else None


def _register_dump(ctx: _Ctx, start: int, end: int) -> Details:
    """Registers of the dump in a crash report (Xtensa or RISC-V)."""
    out: Details = {}
    for i in range(start, end + 1):
        ln = ctx.lines[i]
        if ln.decoded:
            continue
        for key, pat in _REGS:
            if key not in out:
                m = pat.search(ln.text)
                if m:
                    out[key] = m.group(1).lower()
        if "stackmemory" in ln.sq:
            out["stack_dump"] = True
    if "mepc" in out:
        out["arch"] = "riscv"
        out.setdefault("pc", out["mepc"])
    elif "exccause" in out or "excvaddr" in out:
        out["arch"] = "xtensa"
    return out


def _backtrace(ctx: _Ctx, start: int, end: int) -> tuple[int | None, Details]:
    """The first ``Backtrace:`` line of a crash report, parsed (run-together pairs are split)."""
    for i in range(start, end + 1):
        ln = ctx.lines[i]
        if ln.decoded or "acktrace" not in ln.sq:
            continue
        pairs = [(f"0x{pc.lower()}", f"0x{sp.lower()}") for pc, sp in _BT_PAIR.findall(ln.text)]
        if pairs or "corrupted" in ln.sq:
            return i, {"backtrace": pairs, "backtrace_corrupted": "corrupted" in ln.sq}
    return None, {}


def _crash(
    ctx: _Ctx, i: int, kind: str, message: str, details: Details, hint: str | None = None
) -> tuple[int, Finding]:
    """A crash report starting at line ``i``: registers and backtrace read from it, its lines claimed."""
    end = ctx.crash_end(i)
    regs = _register_dump(ctx, i, end)
    bt_i, bt = _backtrace(ctx, i, end)
    ctx.claim(i, end, kind)
    all_details = {**regs, **bt, **{k: v for k, v in details.items() if v is not None}}
    return ctx.finding(i, kind, message, all_details, hint, end=bt_i if bt_i is not None else min(end, i + 3))


# --- detectors: crashes --------------------------------------------------------------------------

_STACK_OVF = ("stackoverflowintask", "overflowintask")
_CANARY = ("stackcanarywatchpoint", "canarywatchpointtrig")
_STACK_GUARD = ("stackprotectionfault",)
_GURU = ("gurumeditation", "rumeditationerror", "meditationerror")
_PANICED = re.compile(r"core\d?paniced")
_TASK = re.compile(r"overflow in task\W*(.+?)\s+has\s+been|overflow in task\W*(\S+)", re.IGNORECASE)
_PAREN = re.compile(r"\(([^()\r\n]{1,40})\)")


def _is_guru(ctx: _Ctx, i: int) -> bool:
    ln = ctx.lines[i]
    return not ln.decoded and (_hit(ln.sq, _GURU) or bool(_PANICED.search(ln.sq)))


def _detect_stack_overflow(ctx: _Ctx) -> Found:
    for i, ln in ctx.unclaimed():
        if ctx.has(i, _STACK_OVF):
            m = _TASK.search(ln.text)
            task = (m.group(1) or m.group(2)) if m else None
            details: Details = {"task": task, "detector": "freertos_check"}
            yield _crash(ctx, i, "stack_overflow", f"stack overflow in task {task!r}", details, _STACK_HINT)
        elif ctx.has(i, _CANARY) or ctx.has(i, _STACK_GUARD):
            start = next((j for j in range(max(0, i - 3), i) if _is_guru(ctx, j) and j not in ctx.claimed), i)
            m = _PAREN.search(ln.text) if ctx.has(i, _CANARY) else None
            task = m.group(1) if m else None
            reason = _reason(ctx.lines[start].text)
            detector = "watchpoint" if ctx.has(i, _CANARY) else "hw_stack_guard"
            message = f"stack overflow{' in task ' + repr(task) if task else ''} ({detector})"
            details = {"task": task, "detector": detector, "core": _core(ctx, start), "reason": reason}
            yield _crash(ctx, start, "stack_overflow", message, details, _STACK_HINT)


_STACK_HINT = "give the task a larger stack (xTaskCreate stack size / CONFIG_ESP_MAIN_TASK_STACK_SIZE)"


def _core(ctx: _Ctx, i: int) -> str | None:
    m = _CORE.search(ctx.lines[i].text)
    return m.group(1) if m else None


def _detect_heap_corruption(ctx: _Ctx) -> Found:
    for i, ln in ctx.unclaimed():
        if ctx.has(i, ("corruptheap", "orruptheap")):
            detail = re.split(r"HEAP\s*:?\s*", ln.text, maxsplit=1, flags=re.IGNORECASE)[-1].strip()[:200]
            message = f"heap corruption detected: {detail[:120]}"
            hint = (
                "something wrote past a heap buffer (e.g. a kernel's scratch buffer); "
                "CONFIG_HEAP_POISONING_COMPREHENSIVE narrows it down"
            )
            yield _crash(ctx, i, "heap_corruption", message, {"detail": detail}, hint)


_IWDT = ("interruptwdttimeout", "wdttimeoutoncpu", "nterruptwdttime")
_CPU = re.compile(r"on\s*CPU\s*(\d)", re.IGNORECASE)


def _detect_interrupt_watchdog(ctx: _Ctx) -> Found:
    for i, ln in ctx.unclaimed():
        if not ctx.has(i, _IWDT):
            continue
        m = _CPU.search(ln.text)
        cpu = m.group(1) if m else None
        message = (
            f"interrupt watchdog timeout on CPU{cpu if cpu is not None else '?'}: "
            "interrupts stayed disabled (or an ISR ran) too long"
        )
        details: Details = {"cpu": cpu, "core": _core(ctx, i), "reason": "Interrupt wdt timeout"}
        hint = "look for a critical section or ISR that never ends (the backtrace shows where the CPU was)"
        yield _crash(ctx, i, "interrupt_watchdog", message, details, hint)


_ABORT_AT = re.compile(
    r"abort\(?\)?\s*was called at PC\s*(0x[0-9a-fA-F]+)(?:\s*on core\s*(\d))?", re.IGNORECASE
)
_ASSERT = re.compile(r"(assert(?:ion)?\W.{0,200}?fail.*|.{0,120}assert failed.*)", re.IGNORECASE)


def _abort_kind(ctx: _Ctx, i: int) -> tuple[str, Details] | None:
    """What makes line ``i`` an abort headline (message and details), if anything."""
    ln = ctx.lines[i]
    if ln.decoded:
        return None
    sq = ln.sq
    if _hit(sq, ("stacksmashingprotect",)):
        return "stack smashing protection failure (abort)", {"reason": "stack smashing"}
    if _hit(sq, ("taskwdtaborting",)):
        return (
            "the task watchdog aborted the firmware (CONFIG_ESP_TASK_WDT_PANIC)",
            {"reason": "task_watchdog"},
        )
    if _hit(sq, ("assertfailed",)) or re.search(r"ssertion.{0,200}failed", sq):
        m = _ASSERT.search(ln.body)
        text = (m.group(1) if m else ln.body).strip()[:200]
        return f"assertion failed: {text[:160]}", {"reason": "assert", "assert": text}
    if _hit(sq, ("abortwascalled",)):
        m = _ABORT_AT.search(ln.text)
        pc = m.group(1).lower() if m else None
        core = m.group(2) if m else None
        details: Details = {"reason": "abort", "pc": pc, "core": core}
        return f"abort() called at PC {pc or '?'} on core {core or '?'}", details
    return None


def _detect_abort(ctx: _Ctx) -> Found:
    for i, _ in ctx.unclaimed():
        hit = _abort_kind(ctx, i)
        if hit is None:
            continue
        message, details = hit
        if details["reason"] == "task_watchdog":  # the abort() line right after it has the PC
            for j in range(i + 1, min(len(ctx.lines), i + 4)):
                m = _ABORT_AT.search(ctx.lines[j].text)
                if m:
                    details.update(pc=m.group(1).lower(), core=m.group(2))
        yield _crash(ctx, i, "abort", message, details)


def _detect_panic(ctx: _Ctx) -> Found:
    for i, ln in ctx.unclaimed():
        if not _is_guru(ctx, i):
            continue
        text = ln.text
        reason = _reason(text)
        if reason is None:  # "(LoadProhibited)" may wrap onto the next line
            nxt = ctx.lines[i + 1].text if i + 1 < len(ctx.lines) else ""
            p = _PAREN.search(nxt)
            reason = p.group(1).strip() if p else None
        core = _core(ctx, i)
        kind = "abort" if reason and reason.lower() == "abort" else "panic"
        _, f = _crash(ctx, i, kind, "", {"core": core, "reason": reason})
        where = f.details.get("pc") or "?"
        msg = f"panic on core {core or '?'}: {reason or 'reason lost'} at PC {where}"
        yield i, dataclasses.replace(f, message=msg)


_DUMP = ("registerdump", "exccause", "excvaddr", "mcause", "mepc")


def _detect_orphan_crash(ctx: _Ctx) -> Found:
    """A register dump or backtrace nobody claimed: the crash headline was lost, the report is not."""
    for i, ln in ctx.unclaimed():
        if i in ctx.explained or ln.decoded:
            continue
        dump = any(a in ln.sq for a in _DUMP) and bool(re.search(_HEX, ln.text) or "registerdump" in ln.sq)
        trace = "acktrace" in ln.sq and bool(_BT_PAIR.search(ln.text))
        if dump or trace:
            _, f = _crash(ctx, i, "panic", "", {"reason": None, "headline_lost": True})
            msg = (
                f"crash report without its headline (the panic line was lost): "
                f"{'register dump' if dump else 'backtrace'} at PC {f.details.get('pc') or '?'}"
            )
            yield i, dataclasses.replace(f, message=msg)


# --- detectors: allocation and TFLM --------------------------------------------------------------

_MEM_ALLOC = ("memallocfail", "emallocfailsize")
_MEM_ALLOC_RE = re.compile(
    r"alloc fail\.?\s*size\s*(0x[0-9a-fA-F]+)\s*caps\s*(0x[0-9a-fA-F]+)", re.IGNORECASE
)
_CAPS = {
    0x1: "EXEC",
    0x2: "32BIT",
    0x4: "8BIT",
    0x8: "DMA",
    0x400: "SPIRAM",
    0x800: "INTERNAL",
    0x1000: "DEFAULT",
}
# application wording for a failed allocation, on the squeezed line (each phrase also without its first
# character): malloc failed, memory allocation failed, failed to allocate, couldn't/cannot/unable to
# allocate, out of memory, ESP_ERR_NO_MEM, no mem for ..., IDF's heap_caps_print_heap_info() dump
_APP_ALLOC = re.compile(
    r"alloc[a-z0-9]{0,6}fail|ailedto(?:m|c|re)?alloc|ailto(?:m|c|re)?alloc"
    r"|(?:nableto|ouldnt|ouldnot|annot|ant)allocate|utof(?:heap)?memory|errnomem|nomemfor"
    r"|eapsummaryforcapabilities"
)
_BYTES = re.compile(r"(\d+)\s*bytes", re.IGNORECASE)


def _detect_heap_alloc(ctx: _Ctx) -> Found:
    for i, ln in ctx.unclaimed():
        if ctx.has(i, _MEM_ALLOC):  # heap_caps_alloc_failed -> esp_system_abort: a crash report
            m = _MEM_ALLOC_RE.search(ln.text)
            size = int(m.group(1), 16) if m else None
            caps = int(m.group(2), 16) if m else None
            what = "size lost"
            if size is not None and caps is not None:
                names = "|".join(name for bit, name in _CAPS.items() if caps & bit) or f"0x{caps:x}"
                what = f"{size} bytes with caps {names}"
            message = f"heap allocation failed ({what}) and the heap aborted ({_ABORT_ON_FAIL})"
            details: Details = {"source": "idf_heap", "size": size, "caps": caps}
            yield _crash(ctx, i, "alloc_failure", message, details, _ALLOC_HINT)
            continue
        if ln.decoded or i in ctx.explained or not _APP_ALLOC.search(ln.sq):
            continue
        m = _BYTES.search(ln.body)
        ctx.explained.add(i)
        message = f"allocation failed: {ln.body.strip()[:160]}"
        details = {"source": "text", "bytes": int(m.group(1)) if m else None}
        yield ctx.finding(i, "alloc_failure", message, details, _ALLOC_HINT)


_ABORT_ON_FAIL = "CONFIG_HEAP_ABORT_WHEN_ALLOCATION_FAILS"
_ALLOC_HINT = (
    "the firmware ran out of heap: a smaller tensor arena (--arena-kb) or one in PSRAM leaves more "
    "internal RAM; check the free heap before the allocation"
)


@dataclasses.dataclass(frozen=True)
class _TflmRule:
    """TFLM messages of one family (harness/data/device_messages.toml ``[[tflm]]``)."""

    kind: str
    family: str
    anchors: tuple[str, ...]  # squeezed key words
    patterns: tuple[re.Pattern[str], ...]  # regexes over the squeezed line
    raw: tuple[re.Pattern[str], ...]  # regexes over the line as printed

    def hit(self, ctx: _Ctx, i: int) -> bool:
        ln = ctx.lines[i]
        return not ln.decoded and (
            _hit(ln.sq, self.anchors)
            or any(p.search(ln.sq) for p in self.patterns)
            or any(p.search(ln.text) for p in self.raw)
        )


_MESSAGES = parse_toml((data_dir() / "device_messages.toml").read_text(encoding="utf-8"))
_TFLM_RULES: tuple[_TflmRule, ...] = tuple(
    _TflmRule(
        r["kind"],
        r["family"],
        tuple(r.get("anchors", ())),
        tuple(re.compile(p) for p in r.get("patterns", ())),
        tuple(re.compile(p) for p in r.get("raw", ())),
    )
    for r in _MESSAGES["tflm"]
)
_TFLM_SCHEMA = ("schemaversion",)
_OP_RE = re.compile(
    r"opcode\s*'?([A-Z][A-Z0-9_]{1,40})'?(?:\s*version\s*'?(\d+))?|op code\s*([A-Z][A-Z0-9_]{1,40})"
)
_NUMS = re.compile(r"Requested:?\s*(\d+),?\s*available:?\s*(\d+),?\s*missing:?\s*(\d+)", re.IGNORECASE)
_NEEDED = re.compile(r"Needed\s*(\d+)\s*but only\s*(\d+)", re.IGNORECASE)
_SCHEMA_RE = re.compile(r"schema version\s*(\d+)\s*not equal to supported version\s*(\d+)", re.IGNORECASE)
_TFLM_BURST = 12  # lines
Advice = tuple[str, Details, str]  # what happened, the numbers read from the text, what to do
Burst = list[tuple[str, str, str]]  # (text, kind, family) of each line of a burst of TFLM messages


def _tflm_events(ctx: _Ctx) -> list[tuple[int, str, str]]:
    """(line, kind, family) of each TFLM message; the rules' order decides a line that fits several."""
    events: list[tuple[int, str, str]] = []
    for i in ctx.hot:
        if ctx.has(i, _TFLM_SCHEMA) and "supportedversion" in ctx.lines[i].sq:
            events.append((i, "schema_mismatch", "schema"))
            continue
        rule = next((r for r in _TFLM_RULES if r.hit(ctx, i)), None)
        if rule is not None:
            events.append((i, rule.kind, rule.family))
        elif events and i - events[-1][0] <= 3 and ctx.has(i, ("invokefailed",)):
            events.append((i, "tflm_error", "invoke"))
    return events


def _detect_tflm(ctx: _Ctx) -> Found:
    """TFLM's error texts, one finding per burst, the most specific kind winning; numbers become advice."""
    bursts: list[list[tuple[int, str, str]]] = []
    for ev in _tflm_events(ctx):
        if bursts and ev[0] - bursts[-1][-1][0] <= _TFLM_BURST:
            bursts[-1].append(ev)
        else:
            bursts.append([ev])
    for burst in bursts:
        kinds = [k for _, k, _ in burst]
        kind = next(
            k for k in ("missing_op", "arena_too_small", "schema_mismatch", "tflm_error") if k in kinds
        )
        first, last = burst[0][0], burst[-1][0]
        ctx.explained.update(i for i, _, _ in burst)
        message, details, hint = _TFLM_ADVICE[kind]([(ctx.lines[i].text, k, f) for i, k, f in burst])
        details["source"] = "tflm"
        yield ctx.finding(first, kind, message, details, hint, end=last)


def _missing_op_advice(lines: Burst) -> Advice:
    op, version = None, None
    for text, _, _ in lines:
        m = _OP_RE.search(text)
        if m:
            op = op or m.group(1) or m.group(3)
            version = version or m.group(2)
    if op is None:
        return (
            "TFLM has no kernel registered for an op of the model (op name lost)",
            {"op": None},
            "register every op of the model: esp-check generate does it from the .tflite",
        )
    try:
        method = resolver_method(op)
    except ModelError:  # an op TFLite Micro has no kernel for at all
        method = None
    ver = f" version {version}" if version else ""
    if method:
        hint = (
            f"the op resolver lacks {op}: add resolver.{method}() (esp-check generate registers every op of "
            "the model; regenerate the firmware)"
        )
    else:
        hint = f"TFLite Micro has no kernel for {op} at all: convert the model without it"
    return (
        f"TFLM could not find op {op}{ver} in the firmware's op resolver",
        {"op": op, "version": version, "resolver_method": method},
        hint,
    )


def _arena_advice(lines: Burst) -> Advice:
    for text, _, _ in lines:
        m = _NUMS.search(text)
        if m:
            requested, available, missing = (int(x) for x in m.groups())
            break
        n = _NEEDED.search(text)
        if n:
            requested, available = int(n.group(1)), int(n.group(2))
            missing = requested - available
            break
    else:
        return (
            "the tensor arena is too small for the model (numbers lost)",
            {},
            "give the model a larger tensor arena (--arena-kb)",
        )
    more_kb = max(1, math.ceil(missing / 1024))
    details: Details = {
        "requested": requested,
        "available": available,
        "missing": missing,
        "more_kb": more_kb,
    }
    return (
        f"the tensor arena is {missing} bytes short (requested {requested}, available {available})",
        details,
        f"grow the tensor arena by at least {more_kb} KB: --arena-kb <current + {more_kb}> "
        "(more may be needed for the allocations after this one)",
    )


def _schema_advice(lines: Burst) -> Advice:
    for text, _, _ in lines:
        m = _SCHEMA_RE.search(text)
        if m:
            return (
                f"the model's schema version {m.group(1)} is not the firmware's {m.group(2)}",
                {"model_version": int(m.group(1)), "supported": int(m.group(2))},
                "convert the model with a TFLite converter matching the firmware's TFLM",
            )
    return "model schema version mismatch", {}, "convert the model with a matching TFLite converter"


# family -> (what happened, what to do), the most specific family first
_FAMILY_TEXT: dict[str, tuple[str, str]] = {
    "hybrid_model": (
        "the model is a hybrid model (float activations, int8 weights), which TFLite Micro does not run",
        "convert with full integer quantization (a representative dataset; int8 inputs and outputs)",
    ),
    "dynamic_tensor": (
        "the model has a dynamic tensor, which TFLite Micro does not support",
        "convert with fixed input shapes (no -1 dimension)",
    ),
    "unsupported_type": (
        "an op's TFLM kernel does not support a tensor type of the model",
        "quantize the model fully to int8 (or int16 activations where the kernel takes them), or convert "
        "without the op",
    ),
    "check_failed": (
        "a TFLM kernel check failed (TF_LITE_ENSURE): the op's tensors are not what the kernel expects",
        "the check names the condition; the model may need a converter matching the firmware's TFLM",
    ),
    "prepare": (
        "TFLM could not prepare the model",
        "the line before it usually says why (arena size, missing op); enable TFLM's error reporter",
    ),
    "invoke": ("an op failed while TFLM ran the model", "the lines before it say which op and why"),
}


def _generic_tflm_advice(burst: Burst) -> Advice:
    """The most specific family of a burst's ``tflm_error`` lines: what happened and what to do."""
    lines = [(t, f) for t, k, f in burst if k == "tflm_error"]
    family = next((f for f in _FAMILY_TEXT if any(g == f for _, g in lines)), lines[0][1])
    text = next(t for t, g in lines if g == family)
    what, hint = _FAMILY_TEXT.get(family, _FAMILY_TEXT["prepare"])
    return f"{what}: {text.strip()[:160]}", {"family": family}, hint


_TFLM_ADVICE: dict[str, Callable[[Burst], Advice]] = {
    "tflm_error": _generic_tflm_advice,
    "missing_op": _missing_op_advice,
    "arena_too_small": _arena_advice,
    "schema_mismatch": _schema_advice,
}


# the protocol ERROR stage -> kind (any other stage: firmware_error)
_STAGE_KIND = {
    "alloc": "alloc_failure",
    "schema": "schema_mismatch",
    "input": "input_error",
    "model": "model_partition",
}


def _detect_protocol_errors(ctx: _Ctx) -> Found:
    """The parsed capture's own ERROR records (CRC already checked by harness.protocol.capture)."""
    for rec in ctx.parsed.records if ctx.parsed is not None else []:
        if rec.type != "ERROR":
            continue
        stage = rec.fields.get("stage", "internal")
        msg = rec.fields.get("msg")
        kind = _STAGE_KIND.get(stage, "firmware_error")
        i = max(0, min(len(ctx.lines) - 1, rec.line - 1))
        ctx.explained.add(i)
        text = f"the firmware reported an error at stage {stage!r}{' (' + msg + ')' if msg else ''}"
        details: Details = {
            "source": "protocol",
            "stage": stage,
            "code": rec.fields.get("code"),
            "seq": rec.seq,
            "msg": msg,
        }
        yield ctx.finding(i, kind, text, details)


# --- detectors: power, boot, boot mode, watchdog ----------------------------------------------------

_BROWNOUT = ("brownoutdetector", "rownoutdetectorwas", "brownoutrst", "brownoutreset", "brownoutdetect")


def _detect_brownout(ctx: _Ctx) -> Found:
    for i in ctx.hot:
        if ctx.has(i, _BROWNOUT):
            message = "brownout: the supply voltage dropped below the detector threshold"
            details: Details = {"line": ctx.lines[i].text.strip()[:200]}
            hint = "use a better USB cable/port or a powered hub, then rerun"
            yield ctx.finding(i, "brownout", message, details, hint)


_BOOT_FAIL = re.compile(
    r"(invalid header: 0x[0-9a-fA-F]+|flash read err.*|csum err.*|Checksum failure.*|ets_\w+\.c \d+"
    r"|No bootable app partitions.*|image at 0x[0-9a-fA-F]+ has invalid magic byte.*|invalid magic byte.*"
    r"|Failed to verify app image.*|ota data partition invalid.*|load partition table error.*"
    r"|Detected size\(\d+k\) smaller than the size in the binary image header.*|SHA-256 comparison failed.*)",
    re.IGNORECASE,
)
_BOOT_FAIL_SQ = (
    "invalidheader0x",
    "flashreaderr",
    "csumerr",
    "checksumfailure",
    "nobootableapp",
    "invalidmagicbyte",
    "failedtoverifyappimage",
    "loadpartitiontableerror",
    "otadatapartitioninvalid",
    "smallerthanthesizeinthebinary",
    "sha256comparisonfailed",
    *(a for r in _MESSAGES["bootloader"] for a in r["anchors"]),
)
_BOOT_FAIL_PATTERNS = tuple(re.compile(p) for r in _MESSAGES["bootloader"] for p in r.get("patterns", ()))


def _detect_boot_failure(ctx: _Ctx) -> Found:
    for i in ctx.hot:
        ln = ctx.lines[i]
        if ln.decoded:
            continue
        m = _BOOT_FAIL.search(ln.text)
        if not (m or _hit(ln.sq, _BOOT_FAIL_SQ) or any(p.search(ln.sq) for p in _BOOT_FAIL_PATTERNS)):
            continue
        nxt = " ".join(ctx.lines[j].sq for j in range(i + 1, min(i + 5, len(ctx.lines))))
        if "attemptingtobootanyway" in nxt:  # the bootloader goes on: a warning, not a failure
            continue
        detail = (m.group(1) if m else ln.body.strip())[:200]
        if "smallerthanthesizeinthebinary" in ln.sq:
            yield _flash_size_finding(ctx, i, detail)
            continue
        message = f"the chip could not boot the flashed image: {detail[:120]}"
        hint = "reflash (check the offsets and the flash size/mode in the board file)"
        yield ctx.finding(i, "boot_failure", message, {"detail": detail}, hint)


_FLASH_SIZES = re.compile(r"size\((\d+)k\).*?header\((\d+)k\)", re.IGNORECASE)


def _flash_size_finding(ctx: _Ctx, i: int, detail: str) -> tuple[int, Finding]:
    """The image was built for more flash than the chip has: the board file is wrong (exit 2)."""
    m = _FLASH_SIZES.search(ctx.lines[i].text)
    sizes = {"chip_kb": int(m.group(1)), "image_kb": int(m.group(2))} if m else {}
    what = ""
    if m:
        what = f" ({sizes['chip_kb'] // 1024} MB chip, image built for {sizes['image_kb'] // 1024} MB)"
    message = f"the image was built for more flash than the chip has{what}: ESP-IDF refuses to start"
    hint = (
        "use the board file that matches the module (`esptool flash-id` prints the real size), or "
        "lower flash_size in the board file, then rebuild"
    )
    return ctx.finding(i, "flash_size_mismatch", message, {"detail": detail, **sizes}, hint)


_BOOT_MODES = _MESSAGES["boot_mode"]
# a ROM boot-mode name that is not a flash boot, or the ROM's waiting line (device_messages.toml)
_DL_SQ = re.compile(
    "boot0x[0-9a-f]{1,2}(?:"
    + "|".join(re.escape(_SQUEEZE.sub("", n.lower())) for n in _BOOT_MODES["names"])
    + ")|"
    + "|".join(re.escape(w) for w in _BOOT_MODES["waiting"])
)
_BOOT_VALUE = re.compile(r"boot\s*:?\s*0x([0-9a-fA-F]{1,2})\b\s*\(?([^\r\n)]{0,40})")


def _flash_boot(chip: str, value: int) -> bool | None:
    """Whether the strapping value boots from flash on ``chip`` (None: chip unknown)."""
    rules = _BOOT_MODES["flash"].get(chip)
    if rules is None:
        return None
    for rule in rules:
        bits = format(value & ((1 << len(rule)) - 1), f"0{len(rule)}b")
        if all(r in ("X", b) for r, b in zip(rule, bits, strict=True)):
            return True
    return False


def _nameless_download(ctx: _Ctx, i: int) -> bool:
    """A ROM reset line whose boot-mode name was lost, but whose value is not a flash boot for the chip
    its banner names (ESP-IDF's boot_mode.h, as data)."""
    ln = ctx.lines[i]
    m = _BOOT_VALUE.search(ln.text)
    if m is None or "rst0x" not in ln.sq or re.search("flash|download|boot", m.group(2), re.IGNORECASE):
        return False
    chip = _chip_near(ctx, i)
    return chip is not None and _flash_boot(chip, int(m.group(1), 16)) is False


_ROM_CHIP = re.compile(r"ESP-ROM:\s*(esp32[a-z0-9]*)", re.IGNORECASE)
_ETS_ESP32 = re.compile(r"\bets (?:Jun  ?8 2016|Jul 29 2019)")
_MODE_CHIP = (  # ROM boot-mode text -> chip, when no banner survived
    ("DOWNLOAD_BOOT(UART0/UART1/SDIO", "esp32"),
    ("DOWNLOAD(USB/UART0/SDIO_FEI_FEO", "esp32c6"),
    ("DOWNLOAD(USB/UART0/SDIO_REI_REO", "esp32c6"),
    ("DOWNLOAD(USB/UART0/1)", "esp32c3"),
    ("DOWNLOAD(USB/UART0)", "esp32s3"),
)


def _chip_near(ctx: _Ctx, i: int) -> str | None:
    for j in range(i, max(-1, i - 6), -1):
        text = ctx.lines[j].text
        m = _ROM_CHIP.search(text)
        if m:
            return m.group(1).lower()
        if _ETS_ESP32.search(text):
            return "esp32"
    mode = ctx.lines[i].text.upper().replace(" ", "")
    return next((chip for key, chip in _MODE_CHIP if key.replace(" ", "") in mode), None)


def _detect_download_mode(ctx: _Ctx) -> Found:
    """The ROM waiting for a flasher: one finding per capture, counting the banners (resets)."""
    hits = [
        i
        for i in ctx.hot
        if not ctx.lines[i].decoded and (_DL_SQ.search(ctx.lines[i].sq) or _nameless_download(ctx, i))
    ]
    if not hits:
        return
    first = hits[0]
    chip = next((c for c in (_chip_near(ctx, i) for i in hits) if c), None)
    resets = [i for i in hits if "boot0x" in ctx.lines[i].sq] or [first]
    rst = next((m for m in (_RST.search(ctx.lines[i].text) for i in resets) if m), None)
    reason = rst.group(2).upper() if rst else None
    mode = _BOOT_MODE.search(ctx.lines[resets[0]].text)
    pin = strap_pin(chip)
    where = (
        f"{chip}: strap pin {pin}"
        if chip and pin
        else "strap pin GPIO0 on ESP32/S2/S3, GPIO9 on C2/C3/C6/H2, GPIO35 on P4"
    )
    disabled = any("ownloadbootmodesdisabled" in ctx.lines[i].sq for i in hits)
    spi = any("spidownload" in ctx.lines[i].sq for i in hits)
    if reason and "USB" in reason:
        rst_text = f"rst:0x{rst.group(1) if rst else '?'} {reason}"
        hint = (
            f"the chip entered download mode on a USB-Serial-JTAG reset ({rst_text}) with the strap not "
            "necessarily pulled: the host's reset sequence asked the ROM for the serial loader "
            "(esptool/espflash --before usb-reset, or a monitor toggling DTR/RTS). Reset into the app "
            f"with a hard reset (esptool --after hard-reset) or press RST ({where})"
        )
    elif spi:
        hint = (
            "the chip is in SPI download boot (SPI_DOWNLOAD_BOOT, `wait spi download`), a loader that "
            "esptool cannot talk to: the second strap pin was wrong at reset (GPIO8 on C2/C3/C6/H2, "
            f"GPIO46 on S2/S3; {where}): check what drives it, then reset the board"
        )
    else:
        hint = (
            f"the boot strap was low at reset ({where}): release BOOT, check the pull-up and the "
            "DTR/RTS auto-reset circuit, then reset the board"
        )
    if disabled:
        hint += "; this chip's eFuses disable download mode, so it only resets"
    details: Details = {
        "chip": chip,
        "strap_pin": pin,
        "rst_reason": reason,
        "banners": len(resets),
        "boot_mode": mode.group(1) if mode else None,
        "download_disabled": disabled,
        "spi_download": spi,
    }
    ctx.explained.update(hits)
    msg = (
        f"the chip is in download mode (ROM serial loader{', ' + chip if chip else ''}): it never ran the "
        f"firmware ({len(resets)} reset(s) into download mode)"
    )
    yield ctx.finding(first, "download_mode", msg, details, hint, end=hits[-1])


_TWDT = ("taskwatchdoggottriggered", "askwatchdoggottrigger")
_TWDT_TASK = re.compile(r"\s-\s+(\S+)\s+\(CPU")


def _detect_task_watchdog(ctx: _Ctx) -> Found:
    """Task watchdog messages: one warning for all of them (and the dumps it prints when non-fatal).

    ``task_wdt: Aborting.`` is left to the abort detector: with CONFIG_ESP_TASK_WDT_PANIC it is a crash.
    """
    hits: list[int] = []
    tasks: list[str] = []
    for i in ctx.hot:
        if not ctx.has(i, _TWDT):
            continue
        hits.append(i)
        aborting = False
        j = i
        while j < len(ctx.lines) and j < i + 10:
            ln = ctx.lines[j]
            if (
                j > i
                and "taskwdt" not in ln.sq
                and "taskscurrentlyrunning" not in ln.sq
                and not re.search(r"cpu\d", ln.sq)
            ):
                break
            t = _TWDT_TASK.search(ln.text)
            if t:
                tasks.append(t.group(1))
            if "taskwdtaborting" in ln.sq:
                aborting = True
            else:
                ctx.explained.add(j)
            j += 1
        # IDF 5 prints a backtrace (Xtensa) or registers + stack (RISC-V) of the current core
        if not aborting:
            ctx.explained.update(range(j, _dump_end(ctx, j) + 1))
    if not hits:
        return
    message = f"task watchdog triggered {len(hits)}x (non-fatal unless CONFIG_ESP_TASK_WDT_PANIC)"
    details: Details = {"count": len(hits), "tasks": sorted(set(tasks))}
    yield ctx.finding(hits[0], "task_watchdog", message, details, end=hits[0] + 3)


def _dump_end(ctx: _Ctx, start: int) -> int:
    """Last line of a non-fatal register/backtrace/stack dump starting at ``start`` (start - 1 if none)."""
    end = start - 1
    for j in range(start, min(len(ctx.lines), start + 60)):
        ln = ctx.lines[j]
        if (
            ln.decoded
            or not ln.sq
            or any(a in ln.sq for a in (*_DUMP, "acktrace", "stackmemory"))
            or re.match(r"\s*(?:[0-9a-f]{8}:\s*)?(?:0x[0-9a-f]{8}\s*)+$|\s*[A-Z0-9/]{1,7}\s*:\s*0x", ln.body)
        ):
            end = j
            continue
        break
    return end


# --- detectors: native target (host program) -------------------------------------------------------

_NATIVE_EXIT = re.compile(
    r"esp-check native: the program (?:was killed by signal (\d+) \((\w+)\)|exited with status (-?\d+))"
)


def _detect_sanitizer(ctx: _Ctx) -> Found:
    """A sanitizer report of a native build: the headline, the access, the first frames, the summary."""
    n = len(ctx.lines)
    for i, ln in ctx.unclaimed():
        head = san.head(ln.text)
        if head is None:
            continue
        error, where = head.error[:200], head.location
        end = next((j for j in range(i, min(n, i + 400)) if san.SUMMARY.search(ctx.lines[j].text)), None)
        stop = end if end is not None else min(n - 1, i + 60)
        frames: list[str] = []
        access = None
        for j in range(i, stop + 1):
            text = ctx.lines[j].text.strip()
            fm = san.frame(text)
            if fm and len(frames) < 8:
                frames.append(f"{fm.func} {fm.where}".strip())
            am = san.ACCESS.search(text)
            if am and access is None:
                access = f"{am.group(1)} of size {am.group(2)}"
        summary = san.SUMMARY.search(ctx.lines[end].text) if end is not None else None
        ctx.claim(i, stop, "sanitizer")
        top = where
        if frames:  # ``func /long/path/file.c:12`` -> ``func (file.c:12)`` for the one-line message
            func, _, at = frames[0].partition(" ")
            top = f"{func} ({at.rsplit('/', 1)[-1]})" if at else func
        message = f"{head.sanitizer}: {error}" + (f" in {top}" if top else "")
        frame_lines = [j for j in range(i + 1, stop + 1) if san.frame(ctx.lines[j].text)]
        evidence_idx = [i, *frame_lines[:4]]
        if end is not None and end not in evidence_idx:
            evidence_idx.append(end)
        details: Details = {
            "sanitizer": head.sanitizer,
            "error": error,
            "access": access,
            "location": where,
            "frames": frames,
            "summary": summary.group(0).strip() if summary else None,
        }
        details = {k: v for k, v in details.items() if v not in (None, [])}
        hint = (
            "the native build found undefined behaviour or an out-of-bounds access in the firmware or a "
            "kernel (e.g. an ESP-NN scratch buffer too small); the frames name the code"
        )
        _, f = ctx.finding(i, "sanitizer", message[:300], details, hint)
        evidence = tuple(ctx.lines[j].text[:_EVIDENCE_CAP] for j in evidence_idx)
        yield i, dataclasses.replace(f, evidence=evidence)


def _detect_native_exit(ctx: _Ctx) -> Found:
    """The native board's line for a program that ended abnormally, unless a sanitizer explained it."""
    if any(kind == "sanitizer" for kind in ctx.claimed.values()):
        return
    for i, ln in ctx.unclaimed():
        m = _NATIVE_EXIT.search(ln.text)
        if m is None:
            continue
        if m.group(1):
            signo, name = int(m.group(1)), m.group(2)
            message = f"the native program was killed by signal {signo} ({name})"
            details: Details = {"signal": signo, "signal_name": name}
        else:
            status = int(m.group(3))
            message = f"the native program exited with status {status}"
            details = {"status": status}
        ctx.claim(i, i, "native_exit")
        hint = "rebuild with --sanitize: AddressSanitizer/UBSan name the faulting code"
        yield ctx.finding(i, "native_exit", message, details, hint)


# --- the table ------------------------------------------------------------------------------------

# Order matters: a detector skips lines an earlier one claimed (a stack overflow's abort line is part
# of the overflow's report, not a second crash).
DETECTORS: tuple[Detector, ...] = (
    Detector("protocol_errors", (*_STAGE_KIND.values(), "firmware_error"), _detect_protocol_errors),
    Detector("sanitizer", ("sanitizer",), _detect_sanitizer),
    Detector("task_watchdog", ("task_watchdog",), _detect_task_watchdog),
    Detector("stack_overflow", ("stack_overflow",), _detect_stack_overflow),
    Detector("heap_corruption", ("heap_corruption",), _detect_heap_corruption),
    Detector("interrupt_watchdog", ("interrupt_watchdog",), _detect_interrupt_watchdog),
    Detector("tflm", ("missing_op", "arena_too_small", "schema_mismatch", "tflm_error"), _detect_tflm),
    Detector("heap_alloc", ("alloc_failure",), _detect_heap_alloc),
    Detector("abort", ("abort",), _detect_abort),
    Detector("panic", ("panic", "abort"), _detect_panic),
    Detector("orphan_crash", ("panic",), _detect_orphan_crash),
    Detector("brownout", ("brownout",), _detect_brownout),
    Detector("boot_failure", ("boot_failure", "flash_size_mismatch"), _detect_boot_failure),
    Detector("download_mode", ("download_mode",), _detect_download_mode),
    Detector("native_exit", ("native_exit",), _detect_native_exit),
)

_MERGEABLE = ("alloc_failure", "boot_failure", "brownout")
_MERGE_WINDOW = 10  # lines


def _merge_repeats(found: Sequence[tuple[int, Finding]]) -> list[Finding]:
    """One finding per burst or repeat: a boot loop prints ``invalid header`` dozens of times and the same
    panic on every boot; report each once, with a count."""
    out: list[Finding] = []
    last_at: dict[str, tuple[int, int]] = {}  # kind -> (index in out, last line)
    by_message: dict[tuple[str, str], int] = {}
    for idx, f in found:
        source, prev = f.details.get("source"), last_at.get(f.kind)
        target = None if source == "protocol" else by_message.get((f.kind, f.message))
        if target is None and source != "protocol" and prev is not None and f.kind in _MERGEABLE:
            near = idx - prev[1] <= _MERGE_WINDOW and out[prev[0]].details.get("source") == source
            target = prev[0] if near else None
        if target is not None:
            first = out[target]
            details = dict(first.details)
            count = details.get("count", 1)
            details["count"] = (count if isinstance(count, int) else 1) + 1
            evidence = first.evidence if len(first.evidence) >= 12 else (*first.evidence, *f.evidence[:1])
            out[target] = dataclasses.replace(first, details=details, evidence=evidence)
            last_at[f.kind] = (target, idx)
            continue
        last_at[f.kind] = (len(out), idx)
        by_message[(f.kind, f.message)] = len(out)
        out.append(f)
    return out


# --- which lines the detectors look at ------------------------------------------------------------

# Every anchor and trigger of the detectors above and of the boot counting, as patterns over the squeezed
# text (lower-case letters and digits, lines kept). A line none of them hits cannot start evidence; the
# detectors still read the lines around a hit (crash report, dump, burst) through the lazy _Lines.
_HOT_ANCHORS: tuple[str, ...] = (
    *_STACK_OVF, *_CANARY, *_STACK_GUARD, *_GURU, *_IWDT, *_DUMP, *_MEM_ALLOC,
    *(a for r in _TFLM_RULES for a in r.anchors), *_TFLM_SCHEMA, *_BROWNOUT, *_BOOT_FAIL_SQ, *_TWDT,
    "corruptheap", "stacksmashingprotect", "taskwdtaborting", "assertfailed", "abortwascalled",
    "acktrace", "invokefailed", "sanitizer", "runtimeerror", "checknativetheprogram",
    "rst0x", "boot0x", "espromesp32", "promesp32", "2ndstagebootloader", "procpustartusercode",
    "maintaskstartedoncpu0",
)  # fmt: skip
_HOT_PATTERNS: tuple[str, ...] = (
    *(p.pattern for r in _TFLM_RULES for p in r.patterns),
    *(p.pattern for p in _BOOT_FAIL_PATTERNS),
    _PANICED.pattern,
    _APP_ALLOC.pattern,
    _DL_SQ.pattern,
    r"ssertion[a-z0-9]{0,200}failed",
    r"ets[a-z0-9]*c[0-9]",  # ROM `ets_main.c 371`
    r"s[a-z]{3}[0-9]{5,6}",  # ROM banner `ets Jul 29 2019`, also without its first letters
    r"ec1[0-9]+begin",  # protocol BEGIN
)
_KEEP = bytes(range(ord("a"), ord("z") + 1)) + b"0123456789\n"
_DROP = bytes(c for c in range(256) if c not in _KEEP)
_HOT_CAP = 20_000  # hot lines looked at: the first and the last half (a hostile log of nothing but anchors)


def _top_level_alternatives(pattern: str) -> list[str]:
    """``a|b(?:c|d)|e`` -> ``[a, b(?:c|d), e]``: alone, each alternative has a literal prefix to skip to."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*out, pattern[start:]]


# literal anchors are found with bytes.find (_hit: their first character may be lost), the rest with one
# regex per alternative (an alternation of ~100 branches is ten times slower than this on a 25 MB log)
_HOT_ALTERNATIVES = [alt for p in _HOT_PATTERNS for alt in _top_level_alternatives(p)]
_HOT_LITERALS: tuple[bytes, ...] = tuple(
    sorted(
        {a[1:].encode("ascii") for a in _HOT_ANCHORS}
        | {alt.encode("ascii") for alt in _HOT_ALTERNATIVES if alt.isalnum()}  # a regex that is a word
    )
)
_HOT_RES: tuple[re.Pattern[bytes], ...] = tuple(
    re.compile(alt.replace(r"\d", "[0-9]").encode("ascii")) for alt in _HOT_ALTERNATIVES if not alt.isalnum()
)


# Literal anchors are found through their last eight characters, as two 4-grams: each 4-gram of the
# squeezed text (37 symbols: a-z, 0-9, newline) is coded as a number, and a position is a candidate when
# its 4-gram ends an anchor and the 4-gram before it is the one before that anchor's end (two table
# look-ups, vectorized). Only candidates are compared with the anchors: one numpy pass for all anchors,
# where a find per anchor costs ~20 ms per 25 MB each (2.5 s for the ~120 anchors). The last words of
# an anchor are rarer in a healthy log than its first ("invoke", "arena", "esp-check" are everywhere).
# Anchors shorter than eight characters are found one by one (a regex each, with the patterns).
_GRAM = 4
_SYMBOLS = np.full(256, 36, dtype=np.int32)  # a-z, 0-9 -> 0..35; newline (the only other byte) -> 36
_SYMBOLS[np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)] = np.arange(36)
_CHUNK = 1 << 22  # bytes of squeezed text per numpy pass (bounded memory)


def _gram_code(gram: bytes) -> int:
    code = 0
    for c in gram:
        code = code * 37 + int(_SYMBOLS[c])
    return code


_BY_SUFFIX: dict[bytes, tuple[bytes, ...]] = {}
for _lit in (lit for lit in _HOT_LITERALS if len(lit) >= 2 * _GRAM):
    _BY_SUFFIX[_lit[-_GRAM:]] = (*_BY_SUFFIX.get(_lit[-_GRAM:], ()), _lit)
_LAST = np.zeros(37**_GRAM, dtype=bool)  # 4-grams that end an anchor
_LAST[[_gram_code(g) for g in _BY_SUFFIX]] = True
_BEFORE = np.zeros(37**_GRAM, dtype=bool)  # 4-grams just before an anchor's last 4-gram
_BEFORE[[_gram_code(lit[-2 * _GRAM : -_GRAM]) for lits in _BY_SUFFIX.values() for lit in lits]] = True
_SHORT_RES = tuple(re.compile(re.escape(lit)) for lit in _HOT_LITERALS if len(lit) < 2 * _GRAM)


def _gram_candidates(squeezed: bytes) -> list[int]:
    """Positions of four characters that end some literal anchor, after the four that precede its end."""
    out: list[int] = []
    step = _CHUNK
    for start in range(_GRAM, max(_GRAM, len(squeezed) - _GRAM + 1), step):  # windows [start - 4, ...)
        count = min(step + 2 * _GRAM - 1, len(squeezed) - start + _GRAM)
        sym = _SYMBOLS[np.frombuffer(squeezed, dtype=np.uint8, count=count, offset=start - _GRAM)]
        n = count - _GRAM + 1
        code = sym[:n].copy()
        for k in range(1, _GRAM):
            code *= 37
            code += sym[k : k + n]
        hit = _LAST[code[_GRAM:]] & _BEFORE[code[:-_GRAM]]  # code[j + 4] ends, code[j] precedes
        out.extend((np.flatnonzero(hit[:step]) + start).tolist())
    return out


def _hot_offsets(squeezed: bytes) -> list[int]:
    found = [
        pos + _GRAM - len(lit)
        for pos in _gram_candidates(squeezed)
        for lit in _BY_SUFFIX.get(squeezed[pos : pos + _GRAM], ())
        if pos + _GRAM >= len(lit) and squeezed.startswith(lit, pos + _GRAM - len(lit))
    ]
    for pat in (*_SHORT_RES, *_HOT_RES):
        found.extend(m.start() for m in pat.finditer(squeezed))
    return found


_HOT_RAW = (b"!=", b" not near ")  # TF_LITE_ENSURE_EQ / _NEAR ([[tflm]] raw patterns)


def _find_all(data: bytes, lit: bytes) -> list[int]:
    out: list[int] = []
    i = data.find(lit)
    while i >= 0 and len(out) < _HOT_CAP:
        out.append(i)
        i = data.find(lit, i + 1)
    return out


def _line_numbers(data: bytes, offsets: list[int]) -> np.ndarray:
    """The 0-based line of each byte offset in ``data`` (lines end at ``\n``)."""
    if not offsets:
        return np.zeros(0, dtype=np.int64)
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    lines = np.sort(np.searchsorted(newlines, np.asarray(offsets, dtype=np.int64)))
    # sorted, each once: np.unique would import numpy.ma (0.012 s of a run's CPU) for its masked check
    return lines[np.concatenate(([True], lines[1:] != lines[:-1]))]


def _hot_lines(text: str) -> list[int]:
    """Indices of the lines (``text.split("\n")``) that hold an anchor of some detector, found in one
    pass per anchor over the squeezed text instead of line by line (a 25 MB log must be read in seconds)."""
    sq = text.lower().encode("ascii", "ignore").translate(None, _DROP)
    data = text.encode("utf-8", "surrogatepass")  # the punctuation of the raw patterns, line for line
    found = [
        _line_numbers(sq, _hot_offsets(sq)),
        _line_numbers(data, [i for lit in _HOT_RAW for i in _find_all(data, lit)]),
    ]
    out = sorted({int(x) for lines in found for x in lines})
    if len(out) > _HOT_CAP:
        out = out[: _HOT_CAP // 2] + out[-_HOT_CAP // 2 :]
    return out


# --- whole-capture findings ------------------------------------------------------------------------


def _whole(kind: str, message: str, details: Details, hint: str | None = None) -> Finding:
    """A finding about the whole capture (no evidence line), with its kind's severity."""
    return Finding(kind, KINDS[kind], message, details=details, hint=hint)


_HOST_RESET = re.compile(r"POWERON|USB_UART|CHIP_USB|EXT_SYS|EXT_RST|PIN_RST", re.IGNORECASE)
_END = re.compile(re.escape(MARKER.decode()) + r"\d+ END ")
_PRINTED = re.compile(r"[^\s\x00]")
_LOOP_BOOTS = 3  # boots in one run that make a loop (KIND_TABLE's boot_loop, docs/device.md)


def _boot_loop(ctx: _Ctx, found: list[Finding], ended_by: str | None) -> list[Finding]:
    """A run that kept rebooting: its cause, or ``unknown`` when nothing it printed explains it (which
    resets do not count: docs/device.md, "Counting boots")."""
    boots = BootCounter()
    host = download = 0
    for i in ctx.hot:
        ln = ctx.lines[i]
        boots.feed(ln.text)
        m = _RST.search(ln.text)
        if m and "rst0x" in ln.sq:
            if _DL_SQ.search(ln.sq):
                download += 1
            elif _HOST_RESET.search(m.group(2)):
                host += 1
    restarts = boots.count - host - download
    looped = boots.count >= _LOOP_BOOTS and restarts >= _LOOP_BOOTS - 1
    if not looped and ended_by != "boot_loop":
        return []
    kinds = {f.kind for f in found}
    if "download_mode" in kinds:  # one ROM banner per reset while the strap is held: never a boot loop
        return []
    details: Details = {
        "boots": boots.count,
        "host_resets": host,
        "download_resets": download,
        "signals": dict(boots.counts),
    }
    crash = next((f.kind for f in found if f.severity == _FW), None)
    infra_causes = ("flash_size_mismatch", "brownout", "boot_failure")
    cause = next((k for k in infra_causes if k in kinds), crash)
    if cause is None:
        message = (
            f"the board rebooted {boots.count} times during one run and printed no evidence of why "
            "(no crash, brownout, boot failure or download mode): no evidence, not classified"
        )
        hint = (
            "check the supply and the cable and rerun; a firmware that resets itself without a "
            "panic message (esp_restart, hardware watchdog) also shows up like this"
        )
        return [_whole("unknown", message, {**details, "cause": None, "reason": "no evidence"}, hint)]
    loop = _whole(
        "boot_loop", f"the board booted {boots.count} times during one run (cause: {cause})", details
    )
    return [dataclasses.replace(loop, severity=KINDS[cause], details={**details, "cause": cause})]


def _end_of_stream(ctx: _Ctx, found: list[Finding], ended_by: str | None) -> list[Finding]:
    if ended_by is None or ctx.has_end:
        return []
    details: Details = {"ended_by": ended_by}
    if not ctx.printed:
        message = "the board printed nothing (wrong port or baud, board not running, or nothing reset it)"
        return [_whole("silence", message, details)]
    if ended_by == "disconnect":
        if any(f.kind in ("sanitizer", "native_exit") for f in found):
            return []  # a native program that ended: its report says why the stream ended
        return [_whole("disconnect", "the serial link closed before the END record", details)]
    if any(f.severity in (_FW, _INFRA) for f in found) or ended_by == "end_record":
        return []
    if any(f.kind == "task_watchdog" for f in found):
        message = (
            "the firmware stopped before the END record while the task watchdog kept firing: it is stuck"
        )
        return [_whole("hang", message, details)]
    return [
        _whole("no_end", f"no END record ({ended_by}) and no evidence of why: the run is incomplete", details)
    ]


def _corrupted(parsed: Capture | None) -> list[Finding]:
    if parsed is None or parsed.valid:
        return []
    return [
        _whole("corrupted", f"capture failed validation: {problem}", {"problem": str(problem)})
        for problem in parsed.problems[:20]
    ]


def _has_end(text: str) -> bool:
    """Whether a line holds an END record within the part of it the classifier reads."""
    return any(m.end() - (text.rfind("\n", 0, m.start()) + 1) <= _LINE_CAP for m in _END.finditer(text))


def classify(
    raw: bytes | str,
    *,
    ended_by: str | None = None,
    parsed: Capture | None = None,
) -> list[Finding]:
    """Findings in the order their evidence appears (boot loop / end-of-stream findings last).

    ``ended_by`` (from :class:`~harness.device.console.RawCapture`) adds silence / no-END /
    disconnect findings; ``parsed`` (a ``harness.protocol.capture.Capture``) supplies the device's
    CRC-checked ERROR records and adds one ``corrupted`` finding per problem when the records did not
    validate. Without ``parsed``, protocol records in ``raw`` are parsed here (for their ERRORs only).
    """
    records_from = parsed
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    text: bytes | str = raw
    if FRAME_MAGIC in data:  # resident-loop frames carry raw tensor bytes: never read them as text
        text = data = split_stream(data).text
    if records_from is None and MARKER in data:
        records_from = parse_capture(data)
    if isinstance(records_from, Capture):  # lines that are only valid DATA records hold no evidence
        blanked = evidence_text(data, records_from)
        text = text if blanked is data else blanked
    ctx = _Ctx(text, records_from)
    found: list[tuple[int, Finding]] = []
    for detector in DETECTORS:
        found.extend(detector.run(ctx))
    warnings = [f for _, f in found if f.kind == "task_watchdog"]
    if any(f.kind == "flash_size_mismatch" for _, f in found):
        # ESP-IDF's start-up aborts after that message, on every boot: a consequence, not a fault
        found = [(i, f) for i, f in found if f.kind not in ("abort", "panic", "orphan_crash")]
    out = _merge_repeats(sorted(((i, f) for i, f in found if f.kind != "task_watchdog"), key=lambda x: x[0]))
    out += warnings
    out += _boot_loop(ctx, out, ended_by)
    out += _end_of_stream(ctx, out, ended_by)
    out += _corrupted(parsed)
    return out
