"""Reports of a run: JSON summary (schema in docs/ci.md), JUnit XML, Markdown for CI step summaries.

JUnit mapping: one ``<testsuite>`` per job, one ``<testcase>`` per task x input x comparison
(classname ``esp-check.<job>.<model>.<board>``, name ``input<k>[<file>].<a>_vs_<b>``). A mismatch or
a firmware fault is a ``<failure>``; an infrastructure problem (and an aborted task) is an
``<error>``; the raw serial logs of the attempt that decided the verdict go to ``<system-out>``.
"""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from harness import __version__
from harness.runner.results import VERDICTS, RunResult, Task, now_iso

SUMMARY_SCHEMA = "esp-check/run-summary"
SUMMARY_VERSION = 1
RAW_LOG_MAX = 128 * 1024  # per serial log in system-out (head and tail kept)
_XML_ILLEGAL = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    return _XML_ILLEGAL.sub("\ufffd", text)


def _task_board(t: Task) -> str | None:
    a = t.decisive or (t.attempts[-1] if t.attempts else None)
    return a.board if a is not None else t.pinned


def _variant_doc(o: Any) -> dict[str, Any]:
    flash = o.flash or {}
    regions = flash.get("regions") or []
    return {
        "exit_code": o.exit_code,
        "nn_mode": o.nn_mode,
        "capture_valid": o.capture_valid,
        "firmware_sha256": o.firmware_sha256,
        "build_cache_hit": o.build_cache_hit,
        "serial_log": o.serial_log,
        "flash_bytes_written": sum(int(r.get("bytes_written") or 0) for r in regions) if regions else None,
        "flash_regions_skipped": sum(1 for r in regions if r.get("skipped")) if regions else None,
        "problems": o.problems,
        "findings": [f.get("kind", f) if isinstance(f, dict) else f for f in o.findings],
    }


def summary_dict(result: RunResult) -> dict[str, Any]:
    """The JSON summary (``summary.json``); its schema is documented in docs/ci.md."""
    counts: dict[str, int] = {
        "tasks": len(result.tasks),
        "match": 0,
        "mismatch": 0,
        "firmware_fault": 0,
        "infrastructure_error": 0,
        "usage_error": 0,
        "internal_error": 0,
        "aborted": 0,
        "attempts": sum(len(t.attempts) for t in result.tasks),
        "retries": sum(1 for e in result.events if e["kind"] == "retry"),
        "testcases": 0,
        "passed": 0,
        "failures": 0,
        "errors": 0,
    }
    tasks = []
    for t in result.tasks:
        counts[t.verdict] = counts.get(t.verdict, 0) + 1
        cases = testcases_of(t)
        counts["testcases"] += len(cases)
        for c in cases:
            key = {"passed": "passed", "failure": "failures"}.get(c["status"], "errors")
            counts[key] += 1
        tasks.append(
            {
                "id": t.id,
                "job": t.job.name,
                "model": str(t.case.model),
                "inputs": [str(p) for p in t.case.inputs],
                "board_type": t.board_type,
                "placement": t.job.placement,
                "board": _task_board(t),
                "verdict": t.verdict,
                "exit_code": t.exit_code,
                "reason": t.reason,
                "artifact_dir": str(t.dir),
                "firmware_fault_confirmed": (t.fault_attempts >= 2) if t.fault_attempts else None,
                "builds": t.builds,
                "decisive_attempt": t.decisive.n if t.decisive is not None else None,
                "attempts": [
                    {
                        "n": a.n,
                        "board": a.board,
                        "port": a.port,
                        "lock_key": a.lock_key,
                        "started": a.started,
                        "ended": a.ended,
                        "lock_wait_s": round(a.lock_wait_s, 3),
                        "exit_code": a.exit_code,
                        "reason": a.reason,
                        "board_fault": a.board_fault,
                        "dir": str(a.dir) if a.dir else None,
                        "variants": {v: _variant_doc(o) for v, o in a.variants.items()},
                    }
                    for a in t.attempts
                ],
                "testcases": cases,
            }
        )
    return {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_VERSION,
        "tool_version": __version__,
        "host": socket.gethostname(),
        "plan": str(result.plan.path),
        "inventory": str(result.inventory.path),
        "out_dir": str(result.out_dir),
        "started": now_iso(result.started),
        "finished": now_iso(result.finished),
        "seconds": round(result.finished - result.started, 3),
        "exit_code": int(result.exit_code),
        "verdict": _run_verdict(result),
        "interrupted": result.interrupted,
        "simulated": any(b.bench.simulated for b in result.boards),
        "native": any(b.bench.board.is_native for b in result.boards),
        "counts": counts,
        "boards": [
            {
                "name": b.bench.name,
                "type": b.bench.board.name,
                "console": b.bench.board.console,
                "port": b.bench.describe_port(),
                "lock_key": b.lock_key,
                "status": b.status,
                "reason": b.reason,
                "attempts": b.attempts,
                "consecutive_infra_failures": b.consecutive_infra,
                "power_cycled": b.power_cycled,
            }
            for b in result.boards
        ],
        "tasks": tasks,
        "board_usage": result.usage,
        "events": result.events,
    }


def _run_verdict(result: RunResult) -> str:

    if result.interrupted:
        return "interrupted"
    return VERDICTS.get(result.exit_code, "internal_error")


def testcases_of(t: Task) -> list[dict[str, Any]]:
    """The task's testcases: from the decisive attempt, or one error per input x comparison."""
    if t.decisive is not None and t.decisive.testcases and t.verdict != "aborted":
        return [dict(c) for c in t.decisive.testcases]
    kind = {"aborted": "aborted", "usage_error": "usage", "internal_error": "internal"}.get(
        t.verdict, "infrastructure"
    )
    return [
        {
            "input_index": k,
            "input": str(p),
            "comparison": f"{a}-vs-{b}",
            "status": "error",
            "type": kind,
            "message": t.reason or t.verdict,
        }
        for k, p in enumerate(t.case.inputs)
        for a, b in t.job.pairs
    ]


def _raw_logs(t: Task) -> str:
    a = t.decisive or (t.attempts[-1] if t.attempts else None)
    if a is None:
        return ""
    parts = []
    for v, o in a.variants.items():
        if not o.serial_log:
            continue
        try:
            raw = Path(o.serial_log).read_bytes()
        except OSError:
            parts.append(f"===== {v}: {o.serial_log} (missing) =====")
            continue
        if len(raw) > RAW_LOG_MAX:
            half = RAW_LOG_MAX // 2
            raw = raw[:half] + b"\n[... %d bytes omitted ...]\n" % (len(raw) - 2 * half) + raw[-half:]
        parts.append(
            f"===== {v} on {a.board} (attempt {a.n}): {o.serial_log} =====\n" + raw.decode("utf-8", "replace")
        )
    return _xml("\n".join(parts))


def junit_tree(result: RunResult) -> ET.ElementTree:
    root = ET.Element("testsuites", name="esp-check run")
    suites: dict[str, ET.Element] = {}
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for t in result.tasks:
        suite = suites.get(t.job.name)
        if suite is None:
            suite = ET.SubElement(
                root,
                "testsuite",
                name=t.job.name,
                hostname=socket.gethostname(),
                timestamp=now_iso(result.started),
            )
            props = ET.SubElement(suite, "properties")
            ET.SubElement(props, "property", name="esp_check_version", value=__version__)
            ET.SubElement(
                props,
                "property",
                name="simulated",
                value=str(any(b.bench.simulated for b in result.boards)).lower(),
            )
            ET.SubElement(
                props,
                "property",
                name="native",
                value=str(any(b.bench.board.is_native for b in result.boards)).lower(),
            )
            suites[t.job.name] = suite
        board = _task_board(t) or t.board_type
        out_text = _raw_logs(t)
        secs = sum((a.ended or 0) - (a.started or 0) for a in t.attempts if a.started and a.ended)
        cases = testcases_of(t)
        for c in cases:
            a, _, b = c["comparison"].partition("-vs-")
            case = ET.SubElement(
                suite,
                "testcase",
                classname=_xml(f"esp-check.{t.job.name}.{t.case.name}.{board}"),
                name=_xml(f"input{c['input_index']}[{Path(c['input']).name}].{a}_vs_{b}"),
                time=f"{secs / max(1, len(cases)):.3f}",
            )
            if c["status"] == "failure":
                ET.SubElement(case, "failure", message=_xml(c["message"]), type=c["type"]).text = _xml(
                    f"task {t.id}: {t.reason}"
                )
            elif c["status"] == "error":
                ET.SubElement(case, "error", message=_xml(c["message"]), type=c["type"]).text = _xml(
                    f"task {t.id}: {t.reason}\nartifacts: {t.dir}"
                )
            ET.SubElement(case, "system-out").text = out_text
    for suite in suites.values():
        elems = suite.findall("testcase")
        counts = {
            "tests": len(elems),
            "failures": sum(1 for e in elems if e.find("failure") is not None),
            "errors": sum(1 for e in elems if e.find("error") is not None),
            "skipped": 0,
        }
        for k, v in counts.items():
            suite.set(k, str(v))
            if k in totals:
                totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{result.finished - result.started:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def markdown(result: RunResult) -> str:
    """A Markdown summary for ``$GITHUB_STEP_SUMMARY`` (or any CI that renders Markdown)."""
    doc = summary_dict(result)
    c = doc["counts"]
    icon = {
        "match": "✅",
        "mismatch": "❌",
        "firmware_fault": "💥",
        "infrastructure_error": "⚠️",
        "usage_error": "⛔",
        "interrupted": "⏹️",
        "aborted": "⏹️",
        "internal_error": "🐞",
    }
    lines = [
        f"## esp-check run: {icon.get(doc['verdict'], '')} {doc['verdict']} (exit {doc['exit_code']})",
        "",
        f"Plan `{_md(doc['plan'])}` on `{_md(doc['inventory'])}` — {c['tasks']} tasks, "
        f"{c['attempts']} attempts ({c['retries']} retries), {doc['seconds']:.0f} s"
        + (" — **simulated boards**" if doc["simulated"] else "")
        + (" — **NATIVE boards** (firmware built for the PC: generic ESP-NN C kernels, no chip)"
           if doc.get("native") else ""),
        "",
        "| testcases | passed | failures | errors |",
        "|---:|---:|---:|---:|",
        f"| {c['testcases']} | {c['passed']} | {c['failures']} | {c['errors']} |",
        "",
        "| job | model | board | verdict | attempts | detail |",
        "|---|---|---|---|---:|---|",
    ]
    for t in doc["tasks"]:
        lines.append(
            f"| {_md(t['job'])} | {_md(Path(t['model']).name)} | {_md(t['board'] or t['board_type'])} | "
            f"{icon.get(t['verdict'], '')} {t['verdict']} | {len(t['attempts'])} | "
            f"{'' if t['verdict'] == 'match' else _md(t['reason'])} |"
        )
    bad_boards = [b for b in doc["boards"] if b["status"] != "ok"]
    if bad_boards:
        lines += ["", "| board | status | reason |", "|---|---|---|"]
        lines += [f"| {_md(b['name'])} | {b['status']} | {_md(b['reason'])} |" for b in bad_boards]
    lines.append("")
    return "\n".join(lines)


def write_reports(
    result: RunResult,
    *,
    json_path: Path | None = None,
    junit_path: Path | None = None,
    markdown_path: Path | None = None,
) -> dict[str, Path]:
    """Write summary.json, junit.xml and summary.md (default: in the run's out_dir), atomically."""
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": json_path or out / "summary.json",
        "junit": junit_path or out / "junit.xml",
        "markdown": markdown_path or out / "summary.md",
    }
    for t in result.tasks:  # per-task result next to its attempts
        t.dir.mkdir(parents=True, exist_ok=True)
        _atomic(
            t.dir / "result.json",
            json.dumps(
                {
                    "id": t.id,
                    "verdict": t.verdict,
                    "exit_code": t.exit_code,
                    "reason": t.reason,
                    "testcases": testcases_of(t),
                },
                indent=1,
            )
            + "\n",
        )
    _atomic(paths["json"], json.dumps(summary_dict(result), indent=1, default=str) + "\n")
    tmp = paths["junit"].with_name(paths["junit"].name + ".tmp")
    junit_tree(result).write(str(tmp), encoding="utf-8", xml_declaration=True)
    tmp.replace(paths["junit"])
    _atomic(paths["markdown"], markdown(result))
    return paths


def _atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
