"""``esp-check sweep``: hunt ESP-NN kernel bugs on purpose, on the native target (docs/sweep.md).

How the two drivers (sanitized, plain) share the cases and what makes a finding: docs/sweep.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.analysis.sweep_cases import OPS, Case, generate
from harness.analysis.sweep_findings import (
    RAN,
    CaseVerdict,
    Coverage,
    Result,
    SanitizerReport,
    group,
    judge,
    parse_outputs,
    parse_result,
    sanitizer_report,
)
from harness.analysis.sweep_report import c_repro, headline_of, report_md
from harness.analysis.sweep_repro import write_repro
from harness.analysis.sweep_shrink import smaller
from harness.children import SANITIZER_ENV
from harness.errors import EspCheckError, ExitCode, UsageError, stopped_by
from harness.firmware.cache import native_root
from harness.firmware.native.components import ComponentSource, find_components
from harness.firmware.native.sweep_build import (
    ESPNN,
    TFLM,
    build_sweep_driver,
    find_sweep_sources,
    grouped_conv_refusal,
    has_reference,
)
from harness.manifest import NN_EXPECTED

CASE_TIMEOUT_S = 60.0
# the cases of the drivers' first run; each next run takes about BATCH_SECONDS at the rate so far. The
# progress said, and what a stopped sweep loses at most (docs/sweep.md "Progress and stops")
BATCH, BATCH_SECONDS = 100, 5.0
# a finding group (analysis.sweep_findings.group): its JSON fields, and its example case ("example")
Group = dict[str, object]


@dataclass
class SweepOptions:
    ops: tuple[str, ...] = tuple(OPS)
    cases_per_op: int = 200
    seed: int = 0
    api_space: bool = False  # --all: the raw API space, beyond what TFLite produces
    sanitize: bool = True
    components_dir: Path | None = None
    espnn_dir: Path | None = None
    tflm_dir: Path | None = None
    bits: int = 64
    jobs: int | None = None
    cache_dir: Path | None = None  # the build cache (--cache-dir); None: firmware.cache.default_cache_dir()
    cases: list[Case] | None = None  # given cases (--from-model), instead of generated ones
    shrink: bool = True  # shrink each finding's example before writing it


@dataclass
class SweepResult:
    out_dir: Path
    cases: int  # the cases planned
    reference: bool
    sources: dict[str, object]
    findings: list[dict[str, object]] = field(default_factory=list)
    seconds: float = 0.0  # running the cases judged (not the builds, the shrinking, the reproductions)
    verdicts: list[CaseVerdict] = field(default_factory=list)  # the cases judged, in order
    partial: str | None = None  # why the sweep stopped before its end; None: it ran to the end
    stop_code: int = 0  # the exit code of that stop: 130 Ctrl-C, 143 SIGTERM, an error's own

    @property
    def cases_run(self) -> int:
        return len(self.verdicts)

    @property
    def cases_per_second(self) -> float:
        return self.cases_run / max(self.seconds, 1e-9)

    @property
    def coverage(self) -> list[dict[str, object]]:
        coverage = Coverage()
        for v in self.verdicts:
            coverage.add(v)
        return coverage.rows()

    @property
    def not_compared(self) -> list[str]:
        """The ops none of whose cases compared two computations: their kernels absent from the sources,
        or ANSI C aliased to itself, with no reference compiled."""
        rows = self.coverage
        ops = dict.fromkeys(str(r["op"]) for r in rows)
        compared = {r["op"] for r in rows if r["opt_vs_ansi"] or r["vs_reference"]}
        return [op for op in ops if op not in compared]

    @property
    def exit_code(self) -> int:
        """4 for a sanitizer report or a crash, 1 for a wrong value (a fault outranks a mismatch), else 0;
        2 when nothing at all was compared (never a clean sweep over nothing); a partial sweep's stop code."""
        if self.partial is not None:
            return self.stop_code
        kinds = {f["kind"] for f in self.findings}
        if kinds & {"sanitizer", "crash"}:
            return int(ExitCode.FIRMWARE_FAULT)
        if kinds:
            return int(ExitCode.MISMATCH)
        compared = any(r["opt_vs_ansi"] or r["vs_reference"] for r in self.coverage)
        return int(ExitCode.MATCH) if compared else int(ExitCode.USAGE)


@dataclass
class _DriverRun:
    """What the sweep driver printed over a list of cases, and the cases that stopped it."""

    results: dict[int, Result]
    stopped: dict[int, tuple[int | None, str]]  # case id -> (exit code, None when hung; stderr)
    finished: set[int] = field(default_factory=set)  # cases whose "D" line (buffers freed) came


_DONE = re.compile(r"D (\d+)")


def _run_once(program: Path, todo: Sequence[Case], env: dict[str, str]) -> tuple[int | None, str, str]:
    """One driver process over ``todo``: (exit code, or None when it hung and was killed; stdout; stderr)."""
    with tempfile.TemporaryFile("w+") as fin:
        fin.write("".join(c.line() + "\n" for c in todo))
        fin.seek(0)
        try:
            proc = subprocess.run(
                [str(program)],
                stdin=fin,
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=CASE_TIMEOUT_S + 0.05 * len(todo),
            )
        except subprocess.TimeoutExpired as exc:  # stdout/stderr are bytes here, whatever text= says
            out, err = (
                x.decode("utf-8", "replace") if isinstance(x, bytes) else (x or "")
                for x in (exc.stdout, exc.stderr)
            )
            return None, out, err
    return proc.returncode, proc.stdout, proc.stderr


def run_driver(
    program: Path,
    cases: Sequence[Case],
    *,
    dump: bool = False,
    sanitized: bool = False,
    variants: str = "oar",
) -> _DriverRun:
    """Run ``cases`` through the driver; a case that stops it is recorded and the rest run on.

    Every death of the driver is a case's: the first case whose buffers were not freed (no ``D`` line),
    or, when every case was over and the driver still died (at exit), the last one. A hang is killed.
    """
    env = dict(os.environ)
    if sanitized:
        for k, v in SANITIZER_ENV.items():
            env.setdefault(k, v)
    if dump:
        env["ESP_CHECK_SWEEP_DUMP"] = "1"
    env["ESP_CHECK_SWEEP_VARIANTS"] = variants  # o optimized, a ANSI C, r reference
    run = _DriverRun({}, {})
    todo = list(cases)
    while todo:
        code, stdout, stderr = _run_once(program, todo, env)
        for line in stdout.splitlines():
            if (r := parse_result(line)) is not None:
                run.results[r.id] = r
            if (o := parse_outputs(line)) is not None and o[0] in run.results:
                run.results[o[0]].outputs = (o[1][0], o[1][1], o[1][2])
            if d := _DONE.fullmatch(line.strip()):
                run.finished.add(int(d.group(1)))
        if code == 2 and "esp-check sweep:" in stderr:
            raise EspCheckError(
                f"the sweep driver refused its input: {stderr.strip()[-300:]}",
                hint="esp-check wrote a case its own driver does not accept (a bug in esp-check, exit 70): "
                "report it with the command line and the esp-nn/TFLM versions",
            )
        if code == 0:
            missing = [c.id for c in todo if c.id not in run.finished]
            if missing:
                raise EspCheckError(f"the sweep driver exited 0 without finishing cases {missing[:5]}")
            break
        first = next((k for k, c in enumerate(todo) if c.id not in run.finished), len(todo) - 1)
        if todo[first].id in run.finished:
            stderr += "\n(esp-check: the driver died after its last case was over; that case is blamed)"
        run.stopped[todo[first].id] = (code, stderr[-20000:])
        todo = todo[first + 1 :]
    return run


def mark_grouped_conv(cases: Sequence[Case], why: str) -> None:
    """Grouped convs are API-only when the esp-tflite-micro glue refuses them (``why``, not empty)."""
    if not why:
        return
    for c in cases:
        if c.op == "conv" and int(c.meta.get("groups", 1)) > 1 and c.reachable:
            c.reachable = False
            c.meta["why_api_only"] = why


def _crash_text(code: int | None) -> str:
    if code is None:
        return "hung: no result in time, killed"
    return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"


# the sweep driver's kernels, each esp-nn variant named by its ESP-NN mode, then the reference, with the
# letter ESP_CHECK_SWEEP_VARIANTS selects it by
KERNELS = ((NN_EXPECTED["optimized"], "o"), (NN_EXPECTED["ansi"], "a"), ("reference", "r"))


@dataclass
class _Evidence:
    """Everything the runs said about the cases: the values, and who stopped where."""

    plain: _DriverRun
    sanitized: dict[str, _DriverRun] = field(default_factory=dict)  # variant -> its own sanitized run
    crashed: dict[int, list[str]] = field(default_factory=dict)  # case id -> "variant: how it died"


def _split_stopped(program: Path, cases: Sequence[Case], evidence: _Evidence) -> None:
    """A case that killed the plain driver is run again one variant at a time: the crash is then that
    variant's, and the values of the variants that survive (run together again) are still compared."""
    for c in cases:
        if c.id not in evidence.plain.stopped:
            continue
        dead, alive = [], ""
        for name, letter in KERNELS:
            alone = run_driver(program, [c], variants=letter)
            if c.id in alone.stopped:
                dead.append(f"{name}: {_crash_text(alone.stopped[c.id][0])}")
            else:
                alive += letter
        if not dead:  # only together (a heap the first one corrupted): the case's, not one variant's
            dead.append(f"all variants together: {_crash_text(evidence.plain.stopped[c.id][0])}")
        evidence.crashed[c.id] = dead
        if alive and len(alive) < len(KERNELS):
            again = run_driver(program, [c], variants=alive)
            if c.id in again.results:
                evidence.plain.results[c.id] = again.results[c.id]


def collect(programs: dict[bool, Path], cases: Sequence[Case], sanitize: bool) -> _Evidence:
    """The plain driver runs every case (the values); with ``sanitize``, each esp-nn variant then runs
    alone under ASan+UBSan, so one variant's sanitizer stop never hides the other's."""
    ev = _Evidence(run_driver(programs[False], cases))
    _split_stopped(programs[False], cases, ev)
    if sanitize:
        for name, letter in KERNELS[:2]:
            ev.sanitized[name] = run_driver(programs[True], cases, sanitized=True, variants=letter)
    return ev


def judge_runs(cases: Sequence[Case], evidence: _Evidence) -> list[CaseVerdict]:
    """Verdicts from the plain run's values, each variant's sanitizer reports, and the crashes."""
    out = []
    for c in cases:
        reports: list[SanitizerReport] = []
        crashes: list[str] = []
        for name, run in evidence.sanitized.items():
            if c.id in run.stopped:
                code, err = run.stopped[c.id]
                rep = sanitizer_report(err)
                if rep is not None:
                    reports.append({"variant": name, **rep})
                else:
                    crashes.append(f"{name} (sanitized): {_crash_text(code)}")
        sanitized_dead = {r["variant"] for r in reports} | {x.split(" ")[0] for x in crashes}
        for text in evidence.crashed.get(c.id, []):
            if text.split(":")[0] not in sanitized_dead:
                crashes.append(text)
        out.append(judge(c, evidence.plain.results.get(c.id), reports, crashes))
    return out


def sweep(
    options: SweepOptions, out_dir: str | Path, *, progress: Callable[[str], None] | None = None
) -> SweepResult:
    """Build, run, judge and write ``sweep.json`` plus one reproduction per finding group. Stopped early
    (Ctrl-C, SIGTERM, an error), it still writes the cases judged so far, marked partial, and re-raises."""
    say = progress or (lambda _m: None)
    bad = [op for op in options.ops if op not in OPS]
    if bad:
        raise UsageError(f"unknown op(s) {', '.join(bad)}", hint=f"choose from {', '.join(OPS)}")
    cases = options.cases
    if cases is None:
        cases = list(generate(options.ops, options.cases_per_op, options.seed, options.api_space))
    if not cases:
        raise UsageError(
            "there is no case to sweep (0 per op, or --from-model: no int8 op esp-nn runs among --op)",
            hint="ask for 1 or more cases per op (--cases), or give a model with an op esp-nn runs",
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    root = native_root(options.cache_dir)
    espnn, tflm = find_sweep_sources(options.components_dir, options.espnn_dir, options.tflm_dir)
    log = out / "build.log"
    programs = {}
    for sanitized in (True, False) if options.sanitize else (False,):
        say(f"building the sweep driver ({'ASan+UBSan' if sanitized else 'plain'})")
        prog, sources = build_sweep_driver(
            espnn,
            tflm,
            sanitize=sanitized,
            root=root,
            out=out / "bin" / f"sweep-{'san' if sanitized else 'plain'}",
            log_path=log,
            bits=options.bits,
            jobs=options.jobs,
        )
        programs[sanitized] = prog.path
    mark_grouped_conv(cases, grouped_conv_refusal(tflm))
    result = SweepResult(out, len(cases), has_reference(sources.tflm), sources.describe())
    groups: list[Group] = []
    stage, t0 = "running the cases", time.monotonic()
    try:
        say(f"running {len(cases)} cases")
        size = BATCH
        while result.cases_run < len(cases):
            batch = cases[result.cases_run : result.cases_run + size]
            result.verdicts += judge_runs(batch, collect(programs, batch, options.sanitize))
            result.seconds = time.monotonic() - t0
            say(f"ran {result.cases_run}/{len(cases)} cases")
            size = max(BATCH, int(result.cases_per_second * BATCH_SECONDS))
        groups = group(result.verdicts)
        if options.shrink and groups:
            stage = "shrinking the examples"
            say(f"shrinking the examples of {len(groups)} finding group(s)")
            shrink_examples(groups, programs, max(c.id for c in cases) + 1)
        stage = "writing the reproductions"
        board = native_board_args(espnn, tflm, out)
        result.findings = _with_repros(groups, programs[False], out, board, result.sources)
    except (KeyboardInterrupt, EspCheckError) as exc:
        _stopped(result, exc, stage, groups or group(result.verdicts))
        say(f"{result.cases_run} of {len(cases)} cases ran ({result.partial}): {out}/sweep.json is partial")
        raise
    _write(result)
    return result


def _stopped(
    result: SweepResult, exc: KeyboardInterrupt | EspCheckError, stage: str, groups: list[Group]
) -> None:
    """A sweep stopped early: its findings so far (without reproductions), why and its exit code."""
    if isinstance(exc, EspCheckError):
        result.partial, result.stop_code = f"stopped by an error while {stage}: {exc.message}", exc.exit_code
    else:
        result.stop_code, how = stopped_by(exc)
        result.partial = f"{how} while {stage}"
    result.findings = [_finding(g, None) for g in groups]
    _write(result)


SHRINK_ROUNDS = 60
_LETTER = dict(KERNELS)


def _example(group: Group) -> CaseVerdict:
    example = group["example"]
    assert isinstance(example, CaseVerdict)
    return example


def _wants(groups: Sequence[Group]) -> list[tuple[str, str, str, str]]:
    """What must still hold on a smaller case: (kind, variant, error type, function) per group."""
    out = []
    for g in groups:
        san = g.get("sanitizer")
        san = san if isinstance(san, dict) else {}
        out.append(
            (str(g["kind"]), str(g.get("variant", "")), str(san.get("type", "")), str(san.get("in", "")))
        )
    return out


def _holding(
    programs: dict[bool, Path], cands: list[Case], wants: list[tuple[str, str, str, str]]
) -> Case | None:
    """The first of ``cands`` on which every one of ``wants`` still holds (each candidate run for real)."""
    plain = run_driver(programs[False], cands)
    alone: dict[tuple[bool, str], _DriverRun] = {}
    for kind, variant, _t, _f in wants:
        san = kind == "sanitizer"
        if kind in ("sanitizer", "crash") and (san, variant) not in alone:
            alone[(san, variant)] = run_driver(
                programs[san], cands, sanitized=san, variants=_LETTER.get(variant, "oar")
            )
    for c in cands:
        ok = True
        for kind, variant, etype, where in wants:
            if kind == "sanitizer":
                stop = alone[(True, variant)].stopped.get(c.id)
                rep = sanitizer_report(stop[1]) if stop else None
                ok = ok and rep is not None and (rep["type"], rep["in"]) == (etype, where)
            elif kind == "crash":
                ok = ok and c.id in alone[(False, variant)].stopped
            else:
                ok = ok and kind in judge(c, plain.results.get(c.id)).kinds
        if ok:
            return c
    return None


def shrink_examples(groups: list[Group], programs: dict[bool, Path], first_id: int) -> None:
    """Replace each group's example by the smallest case (greedy, :func:`sweep_shrink.smaller`) on which
    all the findings of the groups sharing that example still hold; ``shrunk_from`` keeps the original."""
    by_case: dict[int, list[Group]] = {}
    for g in groups:
        by_case.setdefault(_example(g).case.id, []).append(g)
    next_id = first_id
    for gs in by_case.values():
        original = _example(gs[0]).case
        cur, wants = original, _wants(gs)
        for _ in range(SHRINK_ROUNDS):
            cands = list(smaller(cur))
            for c in cands:
                c.id, next_id = next_id, next_id + 1
            found = _holding(programs, cands, wants) if cands else None
            if found is None:
                break
            cur = found
        if cur is not original:
            for g in gs:
                g["example"] = CaseVerdict(cur, None, [str(g["kind"])])
                g["shrunk_from"] = original.line()


def native_board_args(espnn: ComponentSource, tflm: ComponentSource | None, out: Path) -> list[str] | None:
    """``--board native-esp32 --components-dir DIR``: the board a reproduction must run on to meet the
    very esp-nn sources swept (the default simulated board computes its outputs from the host reference,
    so it says "match"). DIR is the sources' common parent, or ``out/components`` with links to both.
    None when there is no esp-tflite-micro to build a firmware from."""
    if tflm is None:
        return None
    parent = espnn.path.parent.resolve()
    try:  # the common parent, when flash-and-compare's lookup finds these very two trees there
        found = [c.path.resolve() for c in find_components(parent, [ESPNN, TFLM])]
    except EspCheckError:
        found = []
    if found == [espnn.path.resolve(), tflm.path.resolve()]:
        where = parent
    else:
        where = out.resolve() / "components"
        where.mkdir(parents=True, exist_ok=True)
        for src, name in ((espnn, "esp-nn"), (tflm, "esp-tflite-micro")):
            link = where / name
            link.unlink(missing_ok=True)
            link.symlink_to(src.path.resolve(), target_is_directory=True)
    return ["--board", "native-esp32", "--components-dir", str(where)]


def _finding(group: Group, result: Result | None) -> dict[str, object]:
    """A group as sweep.json keeps it: its example's line, meta, status and differences."""
    case = _example(group).case
    f = {key: v for key, v in group.items() if key != "example"}
    example: dict[str, object] = {"line": case.line(), "meta": case.meta, "reachable": case.reachable}
    if result is not None:
        example["status"] = list(result.status)
        diffs = {name: getattr(result, name) for name in ("opt_ansi", "opt_ref", "ansi_ref")}
        example["diff"] = {name: d.__dict__ if d else None for name, d in diffs.items()}
    f["example"] = example
    return f


def _with_repros(
    groups: list[Group],
    plain: Path,
    out: Path,
    board_args: list[str] | None,
    sources: dict[str, object],
) -> list[dict[str, object]]:
    """Each group's example run again with its outputs dumped; one reproduction directory per example
    case (the groups it stands for share it): case.txt, finding.json, report.md, repro.c, and a .tflite
    where TFLite reaches it."""
    examples = {_example(g).case.id: _example(g).case for g in groups}
    dumped = run_driver(plain, list(examples.values()), dump=True) if examples else _DriverRun({}, {})
    findings = [_finding(g, dumped.results.get(_example(g).case.id)) for g in groups]
    by_case: dict[int, list[dict[str, object]]] = {}
    for f, g in zip(findings, groups, strict=True):
        by_case.setdefault(_example(g).case.id, []).append(f)
    for k, (cid, fs) in enumerate(by_case.items()):
        case, r = examples[cid], dumped.results.get(cid)
        sanitize = any(f["kind"] == "sanitizer" for f in fs)
        words = str(fs[0]["class"]).replace(">=", " ge ").replace("<", " lt ").replace(">", " gt ")
        slug = re.sub(r"[^A-Za-z0-9]+", "-", words).strip("-") or "all"
        where = out / "repro" / f"{k:03d}-{case.op}-{slug}"
        try:
            args = board_args and [*board_args, *(["--sanitize"] if sanitize else [])]
            info = write_repro(case, where, r, args)
            outputs = r.outputs if r is not None else None
            expected = outputs[2] if outputs is not None and r is not None and r.status[2] == RAN else None
            (where / "repro.c").write_text(c_repro(case, expected, sanitize), encoding="utf-8")
            (where / "report.md").write_text(
                report_md(case, fs, outputs, sources, info.get("command"), _text(fs[0].get("shrunk_from"))),
                encoding="utf-8",
            )
            info.update({"report": "report.md", "c_repro": "repro.c", "headline": headline_of(case, fs)})
        except EspCheckError as exc:
            info = {"error": str(exc)}
        for f in fs:
            f["repro"] = info
    return findings


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _write(result: SweepResult) -> None:
    """``sweep.json`` (docs/sweep.md)."""
    report = {
        "schema": "esp-check-sweep/1",
        "target": "NATIVE: generic ESP-NN C kernels compiled for this host; no S3/P4 assembly ran",
        "sources": result.sources,
        "reference_compiled": result.reference,
        "cases": result.cases,
        "cases_run": result.cases_run,
        "partial": result.partial,
        "seconds": round(result.seconds, 3),
        "cases_per_second": round(result.cases_per_second, 1),
        "exit_code": result.exit_code,
        "findings": result.findings,
        "coverage": result.coverage,
        "not_compared": result.not_compared,
    }
    (result.out_dir / "sweep.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
