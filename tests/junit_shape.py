"""The JUnit XML shape CI systems read (Jenkins' JUnit plugin, GitLab, the GitHub test-report
actions), checked element by element: what ``harness.analysis.junit`` must write.

- ``<testsuites>`` (tests, failures, errors, skipped, time) holds only ``<testsuite>``;
- ``<testsuite>`` (name, tests, failures, errors, skipped, time, timestamp, hostname) holds
  ``<properties>`` first, then ``<testcase>`` elements;
- ``<testcase>`` (classname, name, time) holds at most one of ``<failure>``/``<error>``/``<skipped>``
  (with a ``message``), then at most one ``<system-out>``;
- every count equals what the cases say, suites add up to the root, times are numbers >= 0,
  timestamps are ISO 8601 without a zone (the XSD's pattern).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

COUNTS = ("tests", "failures", "errors", "skipped")
OUTCOMES = ("failure", "error", "skipped")


def _time(el: ET.Element) -> float:
    value = float(el.attrib["time"])
    assert value >= 0, f"{el.tag} time {value}"
    return value


def _case(case: ET.Element) -> str:
    assert {"classname", "name", "time"} <= set(case.attrib), case.attrib
    _time(case)
    tags = [c.tag for c in case]
    found = [t for t in tags if t in OUTCOMES]
    assert len(found) <= 1 and set(tags) <= {*OUTCOMES, "system-out", "system-err"}, tags
    assert tags.count("system-out") <= 1 and (not found or tags[0] == found[0]), tags
    if found:
        assert "message" in case.find(found[0]).attrib  # type: ignore[union-attr]
    return found[0] if found else "passed"


def _suite(suite: ET.Element) -> dict[str, int]:
    need = {"name", *COUNTS, "time", "timestamp", "hostname"}
    assert need <= set(suite.attrib), need - set(suite.attrib)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", suite.attrib["timestamp"]), suite.attrib
    _time(suite)
    children = list(suite)
    assert children and children[0].tag == "properties", [c.tag for c in children]
    assert all(p.tag == "property" and {"name", "value"} <= set(p.attrib) for p in children[0])
    assert {c.tag for c in children[1:]} <= {"testcase"}, [c.tag for c in children]
    outcomes = [_case(c) for c in children[1:]]
    counts = {
        "tests": len(outcomes),
        "failures": outcomes.count("failure"),
        "errors": outcomes.count("error"),
        "skipped": outcomes.count("skipped"),
    }
    assert {k: int(suite.attrib[k]) for k in COUNTS} == counts
    return counts


def assert_junit_shape(root: ET.Element) -> None:
    """Fail with the offending element when ``root`` is not a CI-readable JUnit document."""
    assert root.tag == "testsuites" and {*COUNTS, "time"} <= set(root.attrib), root.attrib
    _time(root)
    assert root and {c.tag for c in root} == {"testsuite"}
    totals = dict.fromkeys(COUNTS, 0)
    for suite in root:
        for k, v in _suite(suite).items():
            totals[k] += v
    assert {k: int(root.attrib[k]) for k in COUNTS} == totals
