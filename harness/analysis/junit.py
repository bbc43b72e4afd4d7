"""JUnit XML: the one writer for every command (compare, flash-and-compare, run).

The XML's shape, the counts on every suite and on the root (counted here from the cases, never passed
in by a caller), the naming rule, failure vs error and the XML-safe text: docs/ci.md, "JUnit naming
rule (every command)".
"""

from __future__ import annotations

import io
import re
import socket
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from harness import __version__
from harness.errors import ExitCode
from harness.resources import write_output

Outcome = Literal["passed", "failure", "error", "skipped"]
MESSAGE_MAX = 500  # a failure's message attribute: its first line, cut here (the whole text is the body)
# compiled on first use (re's cache), not at import: its ranges cost ~3 ms, and only --junit writes XML
_XML_ILLEGAL = "[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"


# exit code -> a testcase's outcome and ``type``: a finding (mismatch, firmware fault) is a failure,
# anything that kept a finding from being made an error (docs/ci.md, "JUnit XML")
_OUTCOME_OF: dict[int, tuple[Outcome, str]] = {
    ExitCode.MATCH: ("passed", "match"),
    ExitCode.MISMATCH: ("failure", "mismatch"),
    ExitCode.FIRMWARE_FAULT: ("failure", "firmware_fault"),
    ExitCode.USAGE: ("error", "usage"),
    ExitCode.INFRASTRUCTURE: ("error", "infrastructure"),
    ExitCode.INTERNAL: ("error", "internal"),
    ExitCode.INTERRUPTED: ("error", "aborted"),
    ExitCode.TERMINATED: ("error", "aborted"),
}


def outcome_of(code: ExitCode | int) -> tuple[Outcome, str]:
    """The JUnit outcome and ``type`` of a testcase that ended with exit code ``code``: the one rule
    every writer (compare, flash-and-compare, run) uses. A code that is no ExitCode is esp-check's own
    fault (``internal``), never a pass."""
    return _OUTCOME_OF.get(int(code), ("error", "internal"))  # an ExitCode is equal to its int


def xml_text(text: str) -> str:
    """``text`` with the characters XML 1.0 cannot carry replaced by U+FFFD."""
    return re.sub(_XML_ILLEGAL, "\ufffd", text)


def classname(*where: str) -> str:
    """``esp-check.<where...>``: the run's known parts (job, model, board), empty parts left out."""
    return ".".join(["esp-check", *(w for w in where if w)])


def input_name(index: int, file: str | Path | None = None) -> str:
    """``input<k>[<file name>]``, or ``input<k>`` when the input has no file."""
    return f"input{index}" + (f"[{Path(file).name}]" if file else "")


def check_name(comparison: str) -> str:
    """A comparison ``<a>-vs-<b>`` (or ``<a>_vs_<b>``) as ``<a>_vs_<b>``; other checks unchanged."""
    a, sep, b = comparison.partition("-vs-")
    return f"{a}_vs_{b}" if sep else comparison


def case_name(index: int, file: str | Path | None, check: str) -> str:
    """A testcase's ``name``, the one rule (docs/ci.md "JUnit naming"): ``input<k>[<file>].<check>``
    (a dataset's one case: ``input0[<dataset>].dataset``)."""
    return f"{input_name(index, file)}.{check_name(check)}"


def log_text(logs: Mapping[str, bytes | None], limit: int) -> str:
    """Serial logs for ``<system-out>``: one ``===== <name> =====`` header each, at most ``limit``
    bytes per log (head and tail kept, the middle said to be omitted). A ``None`` log is missing."""
    parts = []
    for name, raw in logs.items():
        if raw is None:
            parts.append(f"===== {name} (missing) =====")
            continue
        if len(raw) > limit:
            half = limit // 2
            raw = raw[:half] + b"\n[... %d bytes omitted ...]\n" % (len(raw) - 2 * half) + raw[-half:]
        parts.append(f"===== {name} =====\n" + raw.decode("utf-8", "replace"))
    return "\n".join(parts)


@dataclass(frozen=True)
class Case:
    """One ``<testcase>``. ``type``/``message``/``text`` describe its failure, error or skip."""

    classname: str
    name: str
    outcome: Outcome = "passed"
    type: str = ""
    message: str = ""
    text: str = ""
    out: str = ""  # <system-out>
    seconds: float = 0.0


def needs_run_case(code: int, outcomes: Iterable[str]) -> bool:
    """A run whose exit code is not a match never shows only passed cases (docs/ci.md): true when
    ``code`` is not a match and every outcome passed (what failed was no comparison: a tap finding, a
    capture kept beside a brownout), so one more case ``run`` must take ``code``'s outcome. The one rule
    of every writer (JUnit, and summary.json's testcases[])."""
    return int(code) != ExitCode.MATCH and all(o == "passed" for o in outcomes)


def with_run_case(cases: list[Case], code: int, where: str, message: str, out: str = "") -> list[Case]:
    """``cases``, plus the case ``run`` with ``code``'s outcome when :func:`needs_run_case`."""
    if not needs_run_case(code, (c.outcome for c in cases)):
        return cases
    outcome, kind = outcome_of(code)
    return [*cases, Case(where, "run", outcome, kind, message or kind, text=message, out=out)]


@dataclass
class Suite:
    """One ``<testsuite>``: its cases and properties (``esp_check_version`` is always added first)."""

    name: str
    cases: list[Case] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    timestamp: datetime | None = None  # default: now
    seconds: float | None = None  # default: the sum of its cases' times


def _counts(cases: Sequence[Case]) -> dict[str, int]:
    return {
        "tests": len(cases),
        "failures": sum(c.outcome == "failure" for c in cases),
        "errors": sum(c.outcome == "error" for c in cases),
        "skipped": sum(c.outcome == "skipped" for c in cases),
    }


def _case(parent: ET.Element, case: Case) -> None:
    el = ET.SubElement(
        parent,
        "testcase",
        classname=xml_text(case.classname),
        name=xml_text(case.name),
        time=f"{case.seconds:.3f}",
    )
    if case.outcome != "passed":
        first = (case.message or case.type or case.outcome).splitlines()[0][:MESSAGE_MAX]
        attrs = {"message": xml_text(first)} | ({"type": case.type} if case.type else {})
        ET.SubElement(el, case.outcome, attrs).text = xml_text(case.text) if case.text else None
    if case.out:
        ET.SubElement(el, "system-out").text = xml_text(case.out)


def _suite(root: ET.Element, suite: Suite) -> tuple[dict[str, int], float]:
    stamp = suite.timestamp or datetime.now(timezone.utc)
    seconds = suite.seconds if suite.seconds is not None else sum(c.seconds for c in suite.cases)
    counts = _counts(suite.cases)
    attrs = {"name": xml_text(suite.name), **{k: str(v) for k, v in counts.items()}, "time": f"{seconds:.3f}"}
    attrs["timestamp"] = stamp.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    attrs["hostname"] = socket.gethostname()
    el = ET.SubElement(root, "testsuite", attrs)
    props = ET.SubElement(el, "properties")
    for k, v in {"esp_check_version": __version__, **suite.properties}.items():
        ET.SubElement(props, "property", name=xml_text(k), value=xml_text(v))
    for c in suite.cases:
        _case(el, c)
    return counts, seconds


def tree(suites: Iterable[Suite], *, name: str = "esp-check", seconds: float | None = None) -> ET.ElementTree:
    """The document: ``<testsuites>`` with the suites, totals counted from their cases."""
    root = ET.Element("testsuites", name=name)
    totals = Counter(_counts([]))  # every count, from 0
    total_time = 0.0
    for s in suites:
        counts, secs = _suite(root, s)
        total_time += secs
        totals.update(counts)
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{seconds if seconds is not None else total_time:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def to_bytes(doc: ET.ElementTree) -> bytes:
    """The document as UTF-8 bytes with an XML declaration."""
    buf = io.BytesIO()
    doc.write(buf, encoding="utf-8", xml_declaration=True)
    return buf.getvalue()


def write(doc: ET.ElementTree, path: str | Path) -> None:
    """Write the document to ``path`` (its folder made; exit 3 naming it when it cannot be written)."""
    write_output(Path(path), to_bytes(doc), "JUnit report")
