"""A sanitizer's report (ASan, LSan, MSan, TSan, UBSan) in a native program's output: the one parser that
the log classifier (``classify``) and the kernel sweep (``sweep_findings``) read reports with."""

from __future__ import annotations

import re
from typing import NamedTuple

_ERROR = re.compile(r"ERROR:\s*((?:Address|Leak|Memory|Thread|UndefinedBehavior)Sanitizer):?\s*([\w-]*).*")
_UB = re.compile(r"(?:(\S+?):(\d+):(?:\d+:)?\s*)?(runtime error:\s*(.*))")
SUMMARY = re.compile(r"SUMMARY:\s*(\w+Sanitizer):?\s*(.{0,240})")
_FRAME = re.compile(r"#(\d+)\s+0x[0-9a-fA-F]+\s+in\s+(\S+)\s*(\S*)")
_FILE_LINE = re.compile(r"(\S+?:\d+)(?::\d+)?")
ACCESS = re.compile(r"^(READ|WRITE) of size (\d+)")


class Head(NamedTuple):  # the line a report starts with
    sanitizer: str  # ``AddressSanitizer`` ... ``UndefinedBehaviorSanitizer``
    error: str  # ``ERROR:`` lines: the error's name (``heap-buffer-overflow``); UBSan: what it says
    line: str  # the line from ``ERROR:`` or ``runtime error:`` on
    location: str | None  # UBSan: the ``file:line`` it reports at


class Frame(NamedTuple):  # one stack frame
    func: str
    where: str  # as printed: ``/src/a.c:12:5``, ``(/lib/libc.so.6+0x29d90)``, ""
    at: str  # ``a.c:12``, "" without a source line


def head(text: str) -> Head | None:
    """The report's first line, when ``text`` is one."""
    m = _ERROR.search(text)
    if m:
        return Head(m.group(1), m.group(2) or "error", m.group(0), None)
    u = _UB.search(text)
    if u is None:
        return None
    where = f"{u.group(1)}:{u.group(2)}" if u.group(1) else None
    return Head("UndefinedBehaviorSanitizer", u.group(4).strip(), u.group(3), where)


def frame(text: str) -> Frame | None:
    """The stack frame on a line of a report (``#0 0x55d1c0 in func /src/a.c:12``)."""
    m = _FRAME.search(text)
    if m is None:
        return None
    fl = _FILE_LINE.match(m.group(3))
    return Frame(m.group(2), m.group(3), fl.group(1).rsplit("/", 1)[-1] if fl else "")
