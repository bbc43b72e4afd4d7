"""Classify what a board printed: crashes, resets, power and link problems.

``classify(raw)`` reads the raw serial bytes (ESP-IDF logs, ROM banners, panic dumps, protocol
records) and returns :class:`Finding` objects. Each finding has a severity that maps to an exit
code: a crash, abort or allocation failure of the firmware is a **firmware fault** (exit 4, a
finding about the firmware, e.g. an optimized kernel overflowing its scratch buffer); a power,
flash-content, link or timeout problem is **infrastructure** (exit 3); the task watchdog is a
**warning** (non-fatal by default). None of them is ever a match. The decisions and their
reasons are tabled in docs/device.md.

Serial input is hostile: everything here is regex over decoded text with bounded scans; nothing
is evaluated.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from harness.errors import ExitCode, combine_exit_codes

__all__ = [
    "KINDS",
    "SEVERITY_EXIT",
    "BootCounter",
    "Finding",
    "Severity",
    "classify",
    "exit_code_for",
]


class Severity:
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

# kind -> default severity (boot_loop depends on its cause, see classify()).
KINDS: dict[str, str] = {
    "panic": Severity.FIRMWARE_FAULT,
    "abort": Severity.FIRMWARE_FAULT,
    "stack_overflow": Severity.FIRMWARE_FAULT,
    "heap_corruption": Severity.FIRMWARE_FAULT,
    "alloc_failure": Severity.FIRMWARE_FAULT,
    "schema_mismatch": Severity.FIRMWARE_FAULT,
    "firmware_error": Severity.FIRMWARE_FAULT,
    "hang": Severity.FIRMWARE_FAULT,
    "boot_loop": Severity.FIRMWARE_FAULT,
    "input_error": Severity.USAGE,
    "brownout": Severity.INFRASTRUCTURE,
    "boot_failure": Severity.INFRASTRUCTURE,
    "silence": Severity.INFRASTRUCTURE,
    "no_end": Severity.INFRASTRUCTURE,
    "disconnect": Severity.INFRASTRUCTURE,
    "corrupted": Severity.INFRASTRUCTURE,
    "task_watchdog": Severity.WARNING,
}


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    severity: str
    message: str
    line: int | None = None  # 1-based line of the first evidence line in the decoded capture
    evidence: tuple[str, ...] = ()
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def exit_code(self) -> ExitCode | None:
        return SEVERITY_EXIT[self.severity]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "line": self.line,
            "evidence": list(self.evidence),
            "details": self.details,
        }


def exit_code_for(findings: Iterable[Finding]) -> ExitCode | None:
    """The exit code the findings alone imply (None when there are only warnings or nothing)."""
    codes = [f.exit_code for f in findings if f.exit_code is not None]
    return combine_exit_codes(codes) if codes else None


# --- patterns ----------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_HEX = r"0x[0-9a-fA-F]{8}"
_GURU = re.compile(r"Guru Meditation Error: Core\s*(\S*)\s+panic'ed \(([^)]*)\)?")
_XT_PC = re.compile(r"\bPC\s*:\s*(" + _HEX + ")")
_XT_EXCVADDR = re.compile(r"EXCVADDR\s*:\s*(" + _HEX + ")")
_XT_EXCCAUSE = re.compile(r"EXCCAUSE\s*:\s*(" + _HEX + ")")
_RV_MEPC = re.compile(r"MEPC\s*:\s*(" + _HEX + ")")
_RV_MTVAL = re.compile(r"MTVAL\s*:\s*(" + _HEX + ")")
_RV_MCAUSE = re.compile(r"MCAUSE\s*:\s*(" + _HEX + ")")
_RV_RA = re.compile(r"\bRA\s*:\s*(" + _HEX + ")")
_STACK_MEM = re.compile(r"^\s*Stack memory:")
_BACKTRACE = re.compile(r"Backtrace:\s*(.*)")
_BT_PAIR = re.compile(r"0x([0-9a-fA-F]{8}):0x([0-9a-fA-F]{8})")
_ABORT = re.compile(r"abort\(\) was called at PC (0x[0-9a-fA-F]+) on core (\d+)")
_ASSERT = re.compile(r"(assert failed: .*|assertion \".*\" failed: .*)")
_STACK_OVF = re.compile(r"\*\*\*ERROR\*\*\* A stack overflow in task (.+?) has been detected")
_CANARY = re.compile(r"Stack canary watchpoint triggered \(([^)]*)\)")
_SMASH = re.compile(r"Stack smashing protect failure")
_HEAP = re.compile(r"CORRUPT HEAP: (.*)")
_TWDT = re.compile(r"Task watchdog got triggered")
_TWDT_ABORT = re.compile(r"task_wdt: Aborting")
_TWDT_TASK = re.compile(r"task_wdt:\s+- (\S+) \(CPU")
_BROWNOUT = re.compile(r"Brownout detector was triggered|rst:0x[0-9a-fA-F]+ \([A-Z_]*BROWN_?OUT[A-Z_]*\)")
_ALLOC = re.compile(
    r"(Arena size is too small for all buffers.*|Failed to allocate (?:tail |head |temp )?memory.*|"
    r"Failed to allocate memory for .*|AllocateTensors\(\) failed.*|Couldn't allocate memory.*|"
    r"Failed to allocate \d+ bytes.*)"
)
_SCHEMA = re.compile(r"(Model provided is schema version \d+ not equal to supported version \d+.*)")
_BOOT_FAIL = re.compile(
    r"(invalid header: 0x[0-9a-fA-F]+|flash read err|csum err|No bootable app partitions.*|"
    r"image at 0x[0-9a-fA-F]+ has invalid magic byte.*|Failed to verify app image.*|"
    r"ota data partition invalid.*|Detected size\(\d+k\) smaller than the size in the binary image header.*)"
)
_RECORD = re.compile(r"(@EC1 (\d+) ERROR (?:[^\r\n*]*? )?)\*([0-9A-F]{8})")
_FIELD = re.compile(r"([a-z][a-z0-9_]*)=(\S+)")
_END = re.compile(r"@EC1 \d+ END ")


class BootCounter:
    """Counts boot starts from several independent signals and reports the largest count.

    On UART boards the ROM prints at 115200 even when the console runs faster, so its ``rst:``
    line may be garbage; the second-stage ``boot: ESP-IDF ... 2nd stage bootloader`` banner, the
    app's start lines and the protocol's ``BEGIN`` record are counted separately, and a boot that
    garbles one signal is still counted by another.
    """

    SIGNALS: ClassVar[dict[str, re.Pattern[str]]] = {
        "rom_rst": re.compile(r"rst:0x[0-9a-fA-F]+ ?\("),
        "rom_banner": re.compile(r"(?:^|[^\w])ets [A-Z][a-z]{2} +\d+ \d{4}|ESP-ROM:esp32"),
        "bootloader": re.compile(r"boot: ESP-IDF \S+.* 2nd stage bootloader"),
        "app_start": re.compile(r"cpu_start: Pro cpu start user code"),
        "main_task": re.compile(r"main_task: Started on CPU0"),
        "begin": re.compile(r"@EC1 0 BEGIN "),
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


def _decode(raw: bytes | str) -> list[str]:
    text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
    text = _ANSI.sub("", text)
    return [ln.rstrip("\r") for ln in text.replace("\r\n", "\n").split("\n")]


def _record_crc_ok(body: str, crc_hex: str) -> bool:
    return zlib.crc32(body.encode("latin-1", errors="replace")) == int(crc_hex, 16)


def _backtrace_after(lines: Sequence[str], start: int, limit: int = 60) -> tuple[int | None, dict[str, Any]]:
    """Find the Backtrace line after ``start`` (before the next crash or boot) and parse it."""
    for i in range(start, min(len(lines), start + limit)):
        if i > start and (_GURU.search(lines[i]) or BootCounter.SIGNALS["rom_rst"].search(lines[i])):
            break
        m = _BACKTRACE.search(lines[i])
        if m:
            rest = m.group(1)
            pairs = [(f"0x{pc.lower()}", f"0x{sp.lower()}") for pc, sp in _BT_PAIR.findall(rest)]
            return i, {"backtrace": pairs, "backtrace_corrupted": "CORRUPTED" in rest}
    return None, {}


def _register_dump(lines: Sequence[str], start: int, limit: int = 40) -> dict[str, Any]:
    """Registers of the dump following a Guru Meditation line (Xtensa or RISC-V)."""
    out: dict[str, Any] = {}
    for i in range(start, min(len(lines), start + limit)):
        line = lines[i]
        if i > start and (_GURU.search(line) or _BACKTRACE.search(line)):
            break
        for key, pat in (
            ("pc", _XT_PC),
            ("excvaddr", _XT_EXCVADDR),
            ("exccause", _XT_EXCCAUSE),
            ("mepc", _RV_MEPC),
            ("mtval", _RV_MTVAL),
            ("mcause", _RV_MCAUSE),
            ("ra", _RV_RA),
        ):
            m = pat.search(line)
            if m and key not in out:
                out[key] = m.group(1).lower()
        if _STACK_MEM.search(line):
            out["stack_dump"] = True
    if "mepc" in out:
        out["arch"] = "riscv"
        out.setdefault("pc", out["mepc"])
    elif "exccause" in out or "excvaddr" in out:
        out["arch"] = "xtensa"
    return out


_MERGEABLE = ("alloc_failure", "boot_failure", "brownout")
_MERGE_WINDOW = 10  # lines


def _merge_repeats(found: Sequence[tuple[int, Finding]]) -> list[Finding]:
    """One finding per burst: a boot loop prints ``invalid header`` dozens of times and TFLM prints
    three lines for one failed allocation; report each once, with a count."""
    out: list[Finding] = []
    last_at: dict[str, tuple[int, int]] = {}  # kind -> (index in out, last line)
    for idx, f in found:
        prev = last_at.get(f.kind)
        if f.kind in _MERGEABLE and f.details.get("source") != "protocol" and prev is not None and (
            idx - prev[1] <= _MERGE_WINDOW or out[prev[0]].message == f.message
        ):
            first = out[prev[0]]
            details = dict(first.details)
            details["count"] = int(details.get("count", 1)) + 1
            evidence = first.evidence if len(first.evidence) >= 12 else (*first.evidence, *f.evidence[:1])
            out[prev[0]] = dataclasses.replace(first, details=details, evidence=evidence)
            last_at[f.kind] = (prev[0], idx)
            continue
        last_at[f.kind] = (len(out), idx)
        out.append(f)
    return out


def classify(
    raw: bytes | str,
    *,
    ended_by: str | None = None,
    parsed: Any | None = None,
    boot_loop_threshold: int = 3,
) -> list[Finding]:
    """Findings in the order their evidence appears (boot loop / end-of-stream findings last).

    ``ended_by`` (from :class:`~harness.device.console.RawCapture`) adds silence / no-END /
    disconnect findings; ``parsed`` (a ``harness.protocol.capture.Capture``) adds one ``corrupted``
    finding per problem when the records did not validate.
    """
    lines = _decode(raw)
    findings: list[tuple[int, Finding]] = []
    absorbed: set[int] = set()  # lines explained by a more specific finding (abort after overflow...)
    boots = BootCounter()
    twdt_lines: list[int] = []
    twdt_tasks: list[str] = []
    saw_end = False

    def add(
        idx: int,
        kind: str,
        message: str,
        details: dict[str, Any] | None = None,
        evidence_to: int | None = None,
        severity: str | None = None,
    ) -> None:
        end = evidence_to if evidence_to is not None else idx
        ev = tuple(ln[:300] for ln in lines[idx : min(end + 1, idx + 12)])
        findings.append((idx, Finding(kind, severity or KINDS[kind], message, idx + 1, ev, details or {})))

    def absorb_crash_tail(start: int, span: int = 12) -> None:
        """The abort()/assert/Guru lines a specific error prints right after itself."""
        for j in range(start, min(len(lines), start + span)):
            if _ABORT.search(lines[j]) or _ASSERT.search(lines[j]) or _GURU.search(lines[j]):
                absorbed.add(j)

    for i, line in enumerate(lines):
        boots.feed(line)
        if _END.search(line):
            saw_end = True
        m = _STACK_OVF.search(line)
        if m:
            bt_i, bt = _backtrace_after(lines, i)
            add(
                i,
                "stack_overflow",
                f"stack overflow in task {m.group(1)!r}",
                {"task": m.group(1), "detector": "freertos_check", **bt},
                evidence_to=bt_i,
            )
            absorb_crash_tail(i + 1)
            continue
        m = _HEAP.search(line)
        if m:
            bt_i, bt = _backtrace_after(lines, i)
            add(
                i,
                "heap_corruption",
                f"heap corruption detected: {m.group(1)[:120]}",
                {"detail": m.group(1)[:200], **bt},
                evidence_to=bt_i,
            )
            absorb_crash_tail(i + 1)
            continue
        m = _GURU.search(line)
        if m and i not in absorbed:
            reason = m.group(2).strip()[:120]
            regs = _register_dump(lines, i + 1)
            bt_i, bt = _backtrace_after(lines, i)
            details: dict[str, Any] = {"core": m.group(1), "reason": reason, **regs, **bt}
            canary = next((c for c in (_CANARY.search(x) for x in lines[i + 1 : i + 4]) if c), None)
            if canary or reason.lower() == "stack protection fault":
                details["task"] = canary.group(1) if canary else None
                details["detector"] = "watchpoint" if canary else "hw_stack_guard"
                add(
                    i,
                    "stack_overflow",
                    f"stack overflow{' in task ' + repr(canary.group(1)) if canary else ''} ({reason})",
                    details,
                    evidence_to=bt_i,
                )
            else:
                where = details.get("pc") or "?"
                add(
                    i,
                    "panic",
                    f"panic on core {m.group(1)}: {reason} at PC {where}",
                    details,
                    evidence_to=bt_i if bt_i is not None else i + 3,
                )
            continue
        if _SMASH.search(line):
            bt_i, bt = _backtrace_after(lines, i)
            add(
                i,
                "abort",
                "stack smashing protection failure (abort)",
                {"reason": "stack smashing", **bt},
                evidence_to=bt_i,
            )
            absorb_crash_tail(i + 1)
            continue
        if _TWDT.search(line):
            twdt_lines.append(i)
            for t in (_TWDT_TASK.search(x) for x in lines[i + 1 : i + 4]):
                if t:
                    twdt_tasks.append(t.group(1))
            continue
        if _TWDT_ABORT.search(line):
            bt_i, bt = _backtrace_after(lines, i)
            ab = next((a for a in (_ABORT.search(x) for x in lines[i : i + 4]) if a), None)
            add(
                i,
                "abort",
                "the task watchdog aborted the firmware (CONFIG_ESP_TASK_WDT_PANIC)",
                {
                    "reason": "task_watchdog",
                    "pc": ab.group(1).lower() if ab else None,
                    "core": ab.group(2) if ab else None,
                    **bt,
                },
                evidence_to=bt_i,
            )
            absorb_crash_tail(i + 1)
            continue
        m = _ASSERT.search(line)
        if m and i not in absorbed:
            bt_i, bt = _backtrace_after(lines, i)
            add(
                i,
                "abort",
                f"assertion failed: {m.group(1)[:160]}",
                {"reason": "assert", "assert": m.group(1)[:200], **bt},
                evidence_to=bt_i,
            )
            absorb_crash_tail(i + 1)
            continue
        m = _ABORT.search(line)
        if m and i not in absorbed:
            bt_i, bt = _backtrace_after(lines, i)
            add(
                i,
                "abort",
                f"abort() called at PC {m.group(1)} on core {m.group(2)}",
                {"reason": "abort", "pc": m.group(1).lower(), "core": m.group(2), **bt},
                evidence_to=bt_i,
            )
            continue
        if _BROWNOUT.search(line):
            add(
                i,
                "brownout",
                "brownout: the supply voltage dropped below the detector threshold",
                {"line": line.strip()[:200]},
            )
            continue
        m = _BOOT_FAIL.search(line)
        if m:
            add(
                i,
                "boot_failure",
                f"the chip could not boot the flashed image: {m.group(1)[:120]}",
                {"detail": m.group(1)[:200]},
            )
            continue
        m = _SCHEMA.search(line)
        if m:
            add(i, "schema_mismatch", m.group(1)[:200], {"source": "tflm"})
            continue
        m = _ALLOC.search(line)
        if m:
            add(i, "alloc_failure", f"allocation failed: {m.group(1)[:160]}", {"source": "tflm"})
            continue
        m = _RECORD.search(line)
        if m and _record_crc_ok(m.group(1), m.group(3)):
            fields = dict(_FIELD.findall(m.group(1)))
            stage = fields.get("stage", "internal")
            kind = {"alloc": "alloc_failure", "schema": "schema_mismatch", "input": "input_error"}.get(
                stage, "firmware_error"
            )
            add(
                i,
                kind,
                f"the firmware reported an error at stage {stage!r}"
                f"{' (' + fields['msg'] + ')' if 'msg' in fields else ''}",
                {
                    "source": "protocol",
                    "stage": stage,
                    "code": fields.get("code"),
                    "seq": int(m.group(2)),
                    "msg": fields.get("msg"),
                },
            )
            continue

    out = _merge_repeats(sorted(findings, key=lambda x: x[0]))

    if twdt_lines:
        i = twdt_lines[0]
        out.append(
            Finding(
                "task_watchdog",
                Severity.WARNING,
                f"task watchdog triggered {len(twdt_lines)}x (non-fatal unless CONFIG_ESP_TASK_WDT_PANIC)",
                i + 1,
                tuple(lines[i : i + 4]),
                {"count": len(twdt_lines), "tasks": sorted(set(twdt_tasks))},
            )
        )

    kinds = {f.kind for f in out}
    if boots.count >= boot_loop_threshold:
        if "brownout" in kinds:
            sev, cause = Severity.INFRASTRUCTURE, "brownout"
        elif "boot_failure" in kinds:
            sev, cause = Severity.INFRASTRUCTURE, "boot_failure"
        else:
            crash = next((f.kind for f in out if f.severity == Severity.FIRMWARE_FAULT), None)
            sev, cause = Severity.FIRMWARE_FAULT, crash or "unknown"
        out.append(
            Finding(
                "boot_loop",
                sev,
                f"the board booted {boots.count} times during one run (cause: {cause})",
                None,
                (),
                {"boots": boots.count, "signals": dict(boots.counts), "cause": cause},
            )
        )

    fatal = any(f.severity in (Severity.FIRMWARE_FAULT, Severity.INFRASTRUCTURE) for f in out)
    if ended_by is not None and not saw_end:
        nonblank = any(ln.strip().strip("\x00") for ln in lines)
        if not nonblank:
            out.append(
                Finding(
                    "silence",
                    Severity.INFRASTRUCTURE,
                    "the board printed nothing (wrong port or baud, board not running, or nothing reset it)",
                    None,
                    (),
                    {"ended_by": ended_by},
                )
            )
        elif ended_by == "disconnect":
            out.append(
                Finding(
                    "disconnect",
                    Severity.INFRASTRUCTURE,
                    "the serial link closed before the END record",
                    None,
                    (),
                    {"ended_by": ended_by},
                )
            )
        elif not fatal:
            if twdt_lines:
                out.append(
                    Finding(
                        "hang",
                        Severity.FIRMWARE_FAULT,
                        "the firmware stopped before the END record while the task watchdog "
                        "kept firing: it is stuck",
                        None,
                        (),
                        {"ended_by": ended_by},
                    )
                )
            elif ended_by != "end_record":
                out.append(
                    Finding(
                        "no_end",
                        Severity.INFRASTRUCTURE,
                        f"no END record ({ended_by}): the run is incomplete",
                        None,
                        (),
                        {"ended_by": ended_by},
                    )
                )

    if parsed is not None and not getattr(parsed, "valid", True):
        for problem in list(getattr(parsed, "problems", []) or [])[:20]:
            out.append(
                Finding(
                    "corrupted",
                    Severity.INFRASTRUCTURE,
                    f"capture failed validation: {problem}",
                    None,
                    (),
                    {"problem": str(problem)},
                )
            )
    return out
