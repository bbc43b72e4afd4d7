"""The sdkconfig line format (``sdkconfig``, ``sdkconfig.defaults``), read as ESP-IDF's kconfgen reads it.

One parser for every reader: the generator's allow-list check, the builders (the resolved sdkconfig, the
``config/sdkconfig.json`` they write) and the native target's Kconfig stand-in. The rules are
esp-idf-kconfig's ``Kconfig._load_config`` (kconfiglib's): after trailing whitespace is dropped, a line is

- ``CONFIG_<NAME>=<value>``: an assignment, the value as written (``y``, ``n``, a number, a ``"string"``);
- ``# CONFIG_<NAME> is not set``: the same as ``CONFIG_<NAME>=n``;
- blank, or ``#`` after any indentation: a comment (so ``# CONFIG_X=y`` and ``#CONFIG_X is not set`` are
  comments, not assignments);
- anything else: malformed, which kconfgen ignores with a warning ("ignoring malformed line").

A symbol assigned twice keeps its last value (kconfgen warns). Kconfig symbol names are letters, digits and
underscores; an assignment to any other name can never reach a symbol and counts as malformed here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

_SET = re.compile(r"CONFIG_([A-Za-z0-9_]+)=(.*)")
_UNSET = re.compile(r"# CONFIG_([A-Za-z0-9_]+) is not set")  # a prefix match, as kconfiglib's
_STRING = re.compile(r'"((?:[^\\"]|\\.)*)"')


class Sdkconfig(NamedTuple):
    # CONFIG_<NAME> -> the value as written (a string keeps its quotes); "is not set" gives "n"
    symbols: dict[str, str]
    malformed: list[str]  # the lines kconfgen would ignore with a warning


def parse(text: str) -> Sdkconfig:
    """The assignments of an sdkconfig or sdkconfig.defaults in the order their symbols first appear, each
    with its last value (module docstring)."""
    symbols: dict[str, str] = {}
    malformed: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if m := _SET.fullmatch(line):
            symbols[f"CONFIG_{m.group(1)}"] = m.group(2)
        elif m := _UNSET.match(line):
            symbols[f"CONFIG_{m.group(1)}"] = "n"
        elif line and not line.lstrip().startswith("#"):
            malformed.append(line)
    return Sdkconfig(symbols, malformed)


def defined(symbols: Mapping[str, str]) -> dict[str, str]:
    """The symbols a build defines (those ``sdkconfig.h`` has): every one but the ``n`` booleans."""
    return {key: value for key, value in symbols.items() if value != "n"}


def is_string(value: str) -> bool:
    """``value`` is a Kconfig string literal (``"..."`` with ``\\"`` and ``\\\\`` escapes)."""
    return _STRING.fullmatch(value) is not None


def unquote(value: str) -> str:
    """A string literal's text (kconfiglib's ``unescape``); any other value as written."""
    m = _STRING.fullmatch(value)
    return re.sub(r"\\(.)", r"\1", m.group(1)) if m else value
