"""Reports of a run: JSON summary (schema in docs/ci.md), JUnit XML, Markdown for CI step summaries.

The JUnit mapping: docs/ci.md "Reports and artifacts".
"""

from __future__ import annotations

import dataclasses
import json
import socket
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from harness import __version__
from harness.analysis import junit
from harness.analysis.schemas import check_version, versioned
from harness.errors import ExitCode, Verdict
from harness.resources import atomic_write
from harness.runner.paths import SUMMARY_SCHEMA
from harness.runner.results import (
    TASK_VERDICTS,
    BoardStatus,
    CaseStatus,
    RunResult,
    Task,
    TaskState,
    Testcase,
    case_of,
)

if TYPE_CHECKING:
    from harness.runner.results import Attempt, VariantOutcome

# 2: a task's verdict is always a Verdict (an aborted task: infrastructure_error) and its new `state`
#    says done or aborted; the run's verdict is always a Verdict (`interrupted` says it was stopped);
#    counts.aborted counts tasks in state aborted (also counted under their verdict).
SUMMARY_VERSION = 2
RAW_LOG_MAX = 128 * 1024  # per serial log in system-out (head and tail kept)


def now_iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _task_board(task: Task) -> str | None:
    return task.reported.board if task.reported is not None else task.pinned


def _variant_doc(outcome: VariantOutcome) -> dict[str, object]:
    regions = outcome.flash["regions"] if outcome.flash else []
    return {
        "exit_code": outcome.exit_code,
        "nn_mode": outcome.nn_mode,
        "capture_valid": outcome.capture_valid,
        "firmware_sha256": outcome.firmware_sha256,
        "build_cache_hit": outcome.build_cache_hit,
        "serial_log": outcome.serial_log,
        "flash_bytes_written": sum(r["bytes_written"] for r in regions) if regions else None,
        "flash_regions_skipped": sum(1 for r in regions if r["skipped"]) if regions else None,
        "problems": outcome.problems,
        "findings": [f.get("kind", f) if isinstance(f, dict) else f for f in outcome.findings],
    }


def _attempt_doc(attempt: Attempt) -> dict[str, object]:
    return {
        "n": attempt.n,
        **attempt.where_and_how(),
        "dir": str(attempt.dir) if attempt.dir else None,
        "variants": {v: _variant_doc(o) for v, o in attempt.variants.items()},
        "dataset": attempt.dataset,
    }


def _task_doc(task: Task) -> dict[str, object]:
    return {
        "id": task.id,
        "job": task.job.name,
        "model": str(task.case.model),
        "inputs": [str(p) for p in task.case.inputs],
        "board_type": task.board_type,
        "placement": task.job.placement,
        "board": _task_board(task),
        "state": str(task.state),
        "verdict": str(_task_verdict(task)),
        "exit_code": task.exit_code,
        "reason": task.reason,
        "artifact_dir": str(task.dir),
        "firmware_fault_confirmed": (task.fault_attempts >= 2) if task.fault_attempts else None,
        "builds": task.builds,
        "decisive_attempt": task.decisive.n if task.decisive is not None else None,
        "attempts": [_attempt_doc(a) for a in task.attempts],
        "testcases": [dataclasses.asdict(c) for c in testcases_of(task)],  # a StrEnum is its value
        "dataset": task.reported.dataset if task.job.data is not None and task.reported is not None else None,
    }


def _task_verdict(task: Task) -> Verdict:
    """A task with neither a verdict nor an exit code ended without one: never a match."""
    if task.verdict is not None:
        return task.verdict
    return Verdict.from_exit_code(task.exit_code if task.exit_code is not None else ExitCode.INFRASTRUCTURE)


def _counts(result: RunResult) -> dict[str, int]:
    tasks = result.tasks
    verdicts = Counter(str(_task_verdict(t)) for t in tasks)
    cases = Counter(c.status for t in tasks for c in testcases_of(t))
    return {
        "tasks": len(tasks),
        **{str(v): verdicts[str(v)] for v in TASK_VERDICTS},
        "aborted": sum(1 for t in tasks if t.state == TaskState.ABORTED),
        "attempts": sum(len(t.attempts) for t in tasks),
        "retries": sum(1 for e in result.events if e["kind"] == "retry"),
        "testcases": cases.total(),
        "passed": cases[CaseStatus.PASSED],
        "failures": cases[CaseStatus.FAILURE],
        "errors": cases[CaseStatus.ERROR],
    }


def summary_dict(result: RunResult, schema_version: int | None = None) -> dict[str, object]:
    """The JSON summary (``summary.json``, docs/run-summary-schema.json).

    ``schema_version=1``: the previous form, deprecated (a DeprecationWarning), kept for one release.
    """
    doc: dict[str, object] = {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_VERSION,
        "tool_version": __version__,
        "host": socket.gethostname(),
        "plan": str(result.plan.path),
        "inventory": str(result.inventory.path),
        "out_dir": str(result.out_dir),
        "previous_run_dir": str(result.moved_aside) if result.moved_aside else None,
        "started": now_iso(result.started),
        "finished": now_iso(result.finished),
        "seconds": round(result.finished - result.started, 3),
        "exit_code": int(result.exit_code),
        "verdict": str(result.verdict),
        "interrupted": result.interrupted,
        "simulated": result.simulated,
        "native": result.native,
        "counts": _counts(result),
        "boards": [
            {
                "name": b.bench.name,
                "type": b.bench.board.name,
                "console": b.bench.board.console,
                "port": b.bench.describe_port(),
                "lock_key": b.lock_key,
                "status": str(b.status),
                "reason": b.reason,
                "attempts": b.attempts,
                "consecutive_infra_failures": b.consecutive_infra,
                "power_cycled": b.power_cycled,
            }
            for b in result.boards
        ],
        "tasks": [_task_doc(t) for t in result.tasks],
        "board_usage": result.usage,
        "events": result.events,
    }
    return versioned(doc, schema_version, what="run summary", downgrades={1: summary_v1})


def check_summary_version(schema_version: int | None) -> None:
    """Refuse an unknown --schema-version before the run, not after it."""
    check_version(schema_version, SUMMARY_VERSION, {1: summary_v1}, what="run summary")


def summary_v1(doc: dict[str, object]) -> dict[str, object]:
    """Run summary v2 -> v1: "aborted" and "interrupted" were verdicts, there was no task state."""
    doc.pop("previous_run_dir", None)
    tasks, counts = doc["tasks"], doc["counts"]
    assert isinstance(tasks, list) and isinstance(counts, dict)
    for t in tasks:
        if t.pop("state", None) == TaskState.ABORTED:
            t["verdict"] = "aborted"
    if doc["interrupted"]:
        doc["verdict"] = "interrupted"
    for v in TASK_VERDICTS:
        counts[str(v)] = sum(1 for t in tasks if t["verdict"] == v)
    return doc


def testcases_of(task: Task) -> list[Testcase]:
    """The task's testcases: from the decisive attempt, or, when it has none, one per input x comparison
    with the task's outcome (docs/ci.md, "JUnit XML": an error unless the verdict is a finding)."""
    if task.decisive is not None and task.decisive.testcases and task.state != TaskState.ABORTED:
        cases = list(task.decisive.testcases)
        code = _task_verdict(task).exit_code
        if junit.needs_run_case(code, (c.status.value for c in cases)):
            cases.append(Testcase(0, "", "run", *case_of(code), task.reason or str(_task_verdict(task))))
        return cases
    if task.state == TaskState.ABORTED:
        status, kind = case_of(ExitCode.INTERRUPTED)
    else:
        status, kind = case_of(_task_verdict(task).exit_code)
        if status == CaseStatus.PASSED:  # no testcase of its attempt shows the match: never passed here
            status, kind = case_of(ExitCode.INFRASTRUCTURE)
    why = task.reason or str(_task_verdict(task))
    if task.job.data is not None:  # a dataset job is one testcase (its per-input verdicts: its report.json)
        source = task.case.dataset or f"random inputs (seed {task.job.data.seed})"
        return [Testcase(0, str(source), "dataset", status, kind, why)]
    return [
        Testcase(k, str(p), f"{a}-vs-{b}", status, kind, why)
        for k, p in enumerate(task.case.inputs)
        for a, b in task.job.pairs
    ]


def _raw_logs(task: Task) -> str:
    a = task.reported
    if a is None:
        return ""
    logs: dict[str, bytes | None] = {}
    for v, o in a.variants.items():
        if not o.serial_log:
            continue
        try:
            raw: bytes | None = Path(o.serial_log).read_bytes()
        except OSError:
            logs[f"{v}: {o.serial_log}"] = None
            continue
        logs[f"{v} on {a.board} (attempt {a.n}): {o.serial_log}"] = raw
    return junit.log_text(logs, RAW_LOG_MAX)


def junit_tree(result: RunResult) -> ET.ElementTree:
    """One ``<testsuite>`` per job, one ``<testcase>`` per task x input x comparison."""
    props = {"simulated": str(result.simulated).lower(), "native": str(result.native).lower()}
    stamp = datetime.fromtimestamp(result.started, timezone.utc)
    suites: dict[str, junit.Suite] = {}
    for t in result.tasks:
        suite = suites.setdefault(t.job.name, junit.Suite(t.job.name, properties=props, timestamp=stamp))
        suite.cases += _task_cases(t)
    return junit.tree(suites.values(), name="esp-check run", seconds=result.finished - result.started)


def _task_cases(task: Task) -> list[junit.Case]:
    where = junit.classname(task.job.name, task.case.name, _task_board(task) or task.board_type)
    out_text = _raw_logs(task)
    secs = sum((a.ended or 0) - (a.started or 0) for a in task.attempts if a.started and a.ended)
    cases = testcases_of(task)
    each = secs / max(1, len(cases))
    found = []
    for c in cases:
        name = "run" if c.comparison == "run" else junit.case_name(c.input_index, c.input, c.comparison)
        text = f"task {task.id}: {task.reason}"
        if c.status == CaseStatus.ERROR:
            text += f"\nartifacts: {task.dir}"
        outcome: junit.Outcome = c.status.value  # a CaseStatus's value is its JUnit outcome
        kind = c.type.value
        found.append(junit.Case(where, name, outcome, kind, c.message, text, out=out_text, seconds=each))
    return found


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


_ICON = {
    "match": "✅",
    "mismatch": "❌",
    "firmware_fault": "💥",
    "infrastructure_error": "⚠️",
    "usage_error": "⛔",
    "aborted": "⏹️",
    "internal_error": "🐞",
}


def markdown(result: RunResult) -> str:
    """A Markdown summary for ``$GITHUB_STEP_SUMMARY`` (or any CI that renders Markdown)."""
    c = _counts(result)
    verdict = str(result.verdict)
    seconds = round(result.finished - result.started, 3)
    stopped = f" — **{result.stopped}**" if result.stopped else ""
    lines = [
        f"## esp-check run: {_ICON.get(verdict, '')} {verdict} (exit {int(result.exit_code)}){stopped}",
        "",
        f"Plan `{_md(str(result.plan.path))}` on `{_md(str(result.inventory.path))}` — {c['tasks']} tasks, "
        f"{c['attempts']} attempts ({c['retries']} retries), {seconds:.0f} s"
        + (" — **simulated boards**" if result.simulated else "")
        + (
            " — **NATIVE boards** (firmware built for the PC: generic ESP-NN C kernels, no chip)"
            if result.native
            else ""
        ),
        "",
        "| testcases | passed | failures | errors |",
        "|---:|---:|---:|---:|",
        f"| {c['testcases']} | {c['passed']} | {c['failures']} | {c['errors']} |",
        "",
        "| job | model | board | verdict | attempts | detail |",
        "|---|---|---|---|---:|---|",
    ]
    for t in result.tasks:
        shown = str(TaskState.ABORTED) if t.state == TaskState.ABORTED else str(_task_verdict(t))
        lines.append(
            f"| {_md(t.job.name)} | {_md(t.case.model.name)} | {_md(_task_board(t) or t.board_type)} | "
            f"{_ICON.get(shown, '')} {shown} | {len(t.attempts)} | "
            f"{'' if shown == 'match' else _md(t.reason)} |"
        )
    bad_boards = [b for b in result.boards if b.status != BoardStatus.OK]
    if bad_boards:
        lines += ["", "| board | status | reason |", "|---|---|---|"]
        lines += [f"| {_md(b.bench.name)} | {b.status!s} | {_md(b.reason)} |" for b in bad_boards]
    lines.append("")
    return "\n".join(lines)


def write_reports(
    result: RunResult,
    *,
    json_path: Path | None = None,
    junit_path: Path | None = None,
    markdown_path: Path | None = None,
    schema_version: int | None = None,
) -> dict[str, Path]:
    """Write every task's result.json, summary.json, junit.xml and summary.md, each atomically.

    Default paths are in the run's out_dir. ``schema_version`` selects the JSON form (summary and
    result.json files; 1 is deprecated and warns once).
    """
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": json_path or out / "summary.json",
        "junit": junit_path or out / "junit.xml",
        "markdown": markdown_path or out / "summary.md",
    }
    doc = summary_dict(result, schema_version)
    task_docs = doc["tasks"]
    assert isinstance(task_docs, list)
    keys = ("id", "state", "verdict", "exit_code", "reason", "testcases")
    for t, task_doc in zip(result.tasks, task_docs, strict=True):  # its summary entry, next to its attempts
        task_result = {
            "schema_version": doc["schema_version"],
            **{k: task_doc[k] for k in keys if k in task_doc},
        }
        atomic_write(t.dir / "result.json", json.dumps(task_result, indent=1) + "\n")
    atomic_write(paths["json"], json.dumps(doc, indent=1, default=str) + "\n")
    atomic_write(paths["junit"], junit.to_bytes(junit_tree(result)))
    atomic_write(paths["markdown"], markdown(result))
    return paths
