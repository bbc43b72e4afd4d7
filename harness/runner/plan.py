"""Test plans (``esp-check run PLAN.toml``): which models, inputs, board types, tolerances, comparisons.

A plan is validated completely before anything is built or flashed; every error is a
:class:`~harness.errors.PlanError` (exit 2) naming the file, the job and the field. Format and
examples: docs/ci.md.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import EspCheckError, PlanError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# comparison names in the plan -> (a, b) source-label pairs of harness.analysis.compare
COMPARISONS: dict[str, tuple[tuple[str, str], ...]] = {
    "optimized-vs-ansi": (("optimized", "ansi"),),
    "optimized-vs-host": (("optimized", "reference"),),
    "ansi-vs-host": (("ansi", "reference"),),
    "each-vs-host": (("optimized", "reference"), ("ansi", "reference")),
}
PLACEMENTS = ("any", "each")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_TIMEOUT_KEYS = ("build", "capture_total", "capture_silence")
_JOB_KEYS = {
    "name",
    "models",
    "inputs",
    "boards",
    "tolerance_lsb",
    "ref_tolerance_lsb",
    "comparisons",
    "timeouts",
    "retries",
    "placement",
    "arena_kb",
    "input_options",
    *("dataset", "random_inputs", "seed", "results", "labels", "repeat"),
}
_DATASET_KEYS = ("dataset", "random_inputs", "seed", "results", "labels", "repeat")
_DEFAULT_KEYS = _JOB_KEYS - {"name", "models", "inputs", "boards", *_DATASET_KEYS} | {"boards"}
_TOP_KEYS = {"defaults", "job", "schema_version", "run"}
_RUN_KEYS = {"backoff_s", "backoff_max_s", "quarantine_after", "lock_timeout_s"}
_INPUT_OPTION_KEYS = {"resize", "color", "scale", "offset", "value_range", "raw_dtype"}


@dataclass(frozen=True)
class Timeouts:
    """Per-stage limits in seconds (mapped onto harness.flows.flash_and_compare.StageTimeouts)."""

    build: float = 1800.0
    capture_total: float = 180.0
    capture_silence: float = 30.0


@dataclass(frozen=True)
class ModelCase:
    """One model of a job with the input files resolved for it (they all go into one firmware)."""

    model: Path
    inputs: tuple[Path, ...]
    dataset: Path | None = None  # the job's ``dataset`` resolved for this model ('{model}' expanded)
    labels: Path | None = None

    @property
    def name(self) -> str:
        return self.model.stem


@dataclass(frozen=True)
class DatasetSpec:
    """A job's dataset settings (flash-and-compare --dataset/--random-inputs; the paths are per case)."""

    random_inputs: int | None = None
    seed: int = 0
    results: str = "full"
    repeat: int = 1


@dataclass(frozen=True)
class Job:
    """One ``[[job]]`` table, with paths resolved and defaults applied."""

    name: str
    cases: tuple[ModelCase, ...]
    boards: tuple[str, ...]  # board type names (boards/*.toml) or board-file paths
    tolerance_lsb: float = 0.0
    ref_tolerance_lsb: float = 0.0
    comparisons: tuple[str, ...] = ("optimized-vs-ansi", "each-vs-host")
    timeouts: Timeouts = Timeouts()
    retries: int = 2
    placement: str = "any"  # any: one free board per type; each: every inventory board of the type
    arena_kb: int | None = None
    input_options: Mapping[str, Any] = field(default_factory=dict)
    data: DatasetSpec | None = None  # a dataset job: each case streams its dataset (or random inputs)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(a, b) source pairs to report, in a stable order without duplicates."""
        out: dict[tuple[str, str], None] = {}
        for c in self.comparisons:
            for p in COMPARISONS[c]:
                out.setdefault(p, None)
        return tuple(out)

    @property
    def needs_reference(self) -> bool:
        return any(b == "reference" for _, b in self.pairs)


@dataclass(frozen=True)
class RunSettings:
    """Plan-wide ``[run]`` settings (retry backoff, quarantine threshold, lock wait)."""

    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    quarantine_after: int = 3
    lock_timeout_s: float = 600.0


@dataclass(frozen=True)
class Plan:
    path: Path
    jobs: tuple[Job, ...]
    run: RunSettings = RunSettings()


def _err(path: Path, where: str, fieldname: str, msg: str, hint: str | None = None) -> PlanError:
    return PlanError(
        f"plan {path}: {where}: field '{fieldname}' {msg}",
        hint=hint or "see docs/ci.md ('Plan file') for every field",
    )


def _number(
    path: Path, where: str, key: str, value: object, *, minimum: float = 0.0, strict: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(path, where, key, f"must be a number, not {value!r}")
    v = float(value)
    if v != v or v < minimum or (strict and v == minimum):
        raise _err(path, where, key, f"must be {'>' if strict else '>='} {minimum:g}, not {value!r}")
    return v


def _int(path: Path, where: str, key: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(path, where, key, f"must be an integer >= {minimum}, not {value!r}")
    return value


def _str_list(path: Path, where: str, key: str, value: object) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(x, str) and x for x in value):
        raise _err(path, where, key, "must be a non-empty list of strings")
    return list(value)


def _expand(base: Path, pattern: str, model_stem: str | None) -> list[Path]:
    """Files matching ``pattern``; ``{model}`` is the model's stem, matched literally (a stem like
    ``net[1]`` holds glob characters, which must not turn into a pattern)."""
    p = Path(pattern).expanduser()
    full = str(p if p.is_absolute() else base / p)
    if model_stem is not None and "{model}" in full:
        if glob.has_magic(full.replace("{model}", "")):
            full = full.replace("{model}", glob.escape(model_stem))
        else:
            literal = Path(full.replace("{model}", model_stem))
            return [literal] if literal.is_file() else []
    if glob.has_magic(full):
        return sorted(Path(m) for m in glob.glob(full, recursive=True) if Path(m).is_file())
    return [Path(full)] if Path(full).is_file() else []


def _timeouts(path: Path, where: str, value: object, base: Timeouts) -> Timeouts:
    if not isinstance(value, dict):
        raise _err(path, where, "timeouts", "must be a table like { capture_total = 180 }")
    unknown = sorted(set(value) - set(_TIMEOUT_KEYS))
    if unknown:
        raise _err(path, where, f"timeouts.{unknown[0]}", "is not a known timeout", f"known: {_TIMEOUT_KEYS}")
    vals = {k: getattr(base, k) for k in _TIMEOUT_KEYS}
    for k, v in value.items():
        vals[k] = _number(path, where, f"timeouts.{k}", v, strict=True)
    return Timeouts(**vals)


def _settings(path: Path, where: str, table: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Validate the job fields shared by ``[defaults]`` and ``[[job]]`` onto a copy of ``base``."""
    out = dict(base)
    for key in ("tolerance_lsb", "ref_tolerance_lsb"):
        if key in table:
            out[key] = _number(path, where, key, table[key])
    if "comparisons" in table:
        comps = _str_list(path, where, "comparisons", table["comparisons"])
        for c in comps:
            if c not in COMPARISONS:
                raise _err(
                    path, where, "comparisons", f"has unknown comparison {c!r}", f"use {list(COMPARISONS)}"
                )
        out["comparisons"] = tuple(comps)
    if "timeouts" in table:
        out["timeouts"] = _timeouts(path, where, table["timeouts"], out["timeouts"])
    if "retries" in table:
        out["retries"] = _int(path, where, "retries", table["retries"])
    if "placement" in table:
        if table["placement"] not in PLACEMENTS:
            raise _err(path, where, "placement", f"must be one of {PLACEMENTS}, not {table['placement']!r}")
        out["placement"] = table["placement"]
    if "arena_kb" in table:
        out["arena_kb"] = _int(path, where, "arena_kb", table["arena_kb"], 1)
    if "boards" in table:
        out["boards"] = tuple(_str_list(path, where, "boards", table["boards"]))
    if "input_options" in table:
        opts = table["input_options"]
        if not isinstance(opts, dict):
            raise _err(path, where, "input_options", "must be a table")
        unknown = sorted(set(opts) - _INPUT_OPTION_KEYS)
        if unknown:
            raise _err(
                path,
                where,
                f"input_options.{unknown[0]}",
                "is not an input option",
                f"known: {sorted(_INPUT_OPTION_KEYS)}",
            )
        from harness.model.inputs import InputOptions

        try:
            InputOptions(**opts)
        except (EspCheckError, TypeError) as exc:
            raise _err(path, where, "input_options", f"is invalid: {exc}") from None
        out["input_options"] = dict(opts)
    return out


def load_plan(path: str | Path, *, check_files: bool = True) -> Plan:
    """Read and validate a plan; raises PlanError (exit 2) naming file, job and field.

    With ``check_files`` every model is parsed and every input glob must match at least one file
    for every model of its job, so a typo fails here and not after an hour of builds.
    """
    p = Path(path)
    data = _read_toml(p)
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise _err(p, "top level", unknown[0], "is not a plan field", f"known: {sorted(_TOP_KEYS)}")
    if data.get("schema_version", 1) != 1:
        raise _err(p, "top level", "schema_version", f"is {data['schema_version']!r}; this esp-check reads 1")
    run = _run_settings(p, data.get("run", {}))
    defaults = _defaults(p, data.get("defaults", {}))
    jobs_raw = data.get("job")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise _err(p, "top level", "job", "is missing: a plan needs at least one [[job]] table")
    jobs: list[Job] = []
    for i, tab in enumerate(jobs_raw):
        job = _job(p, i, tab, defaults, {j.name for j in jobs})
        if check_files:
            _check_job_files(p, job)
        jobs.append(job)
    return Plan(path=p, jobs=tuple(jobs), run=run)


def _read_toml(p: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"plan file not found: {p}", hint="check the path") from None
    except OSError as exc:
        raise PlanError(f"cannot read plan {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"plan {p} is not valid TOML: {exc}", hint="see docs/examples/plan.toml") from None


def _run_settings(p: Path, run_tab: object) -> RunSettings:
    if not isinstance(run_tab, dict):
        raise _err(p, "[run]", "run", "must be a table")
    bad = sorted(set(run_tab) - _RUN_KEYS)
    if bad:
        raise _err(p, "[run]", bad[0], "is not a run setting", f"known: {sorted(_RUN_KEYS)}")
    return RunSettings(
        backoff_s=_number(p, "[run]", "backoff_s", run_tab.get("backoff_s", 1.0)),
        backoff_max_s=_number(p, "[run]", "backoff_max_s", run_tab.get("backoff_max_s", 30.0)),
        quarantine_after=_int(p, "[run]", "quarantine_after", run_tab.get("quarantine_after", 3), 1),
        lock_timeout_s=_number(p, "[run]", "lock_timeout_s", run_tab.get("lock_timeout_s", 600.0)),
    )


def _defaults(p: Path, defaults_tab: object) -> dict[str, Any]:
    if not isinstance(defaults_tab, dict):
        raise _err(p, "[defaults]", "defaults", "must be a table")
    bad = sorted(set(defaults_tab) - _DEFAULT_KEYS)
    if bad:
        raise _err(p, "[defaults]", bad[0], "is not a default job field", f"known: {sorted(_DEFAULT_KEYS)}")
    return _settings(
        p,
        "[defaults]",
        defaults_tab,
        {
            "tolerance_lsb": 0.0,
            "ref_tolerance_lsb": 0.0,
            "comparisons": ("optimized-vs-ansi", "each-vs-host"),
            "timeouts": Timeouts(),
            "retries": 2,
            "placement": "any",
            "arena_kb": None,
            "input_options": {},
            "boards": (),
        },
    )


def _job(p: Path, i: int, tab: object, defaults: dict[str, Any], seen: set[str]) -> Job:
    """One ``[[job]]`` table: name, fields, board types, models and their inputs."""
    if not isinstance(tab, dict):
        raise _err(p, f"job #{i + 1}", "job", "must be a table")
    name = tab.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _err(
            p, f"job #{i + 1}", "name", f"must be a name of letters, digits, '_', '.', '-' (got {name!r})"
        )
    where = f"job {name!r}"
    if name in seen:
        raise _err(p, where, "name", "is used by two jobs; job names must be unique")
    bad = sorted(set(tab) - _JOB_KEYS)
    if bad:
        raise _err(p, where, bad[0], "is not a job field", f"known: {sorted(_JOB_KEYS)}")
    if "models" not in tab:
        raise _err(p, where, "models", "is missing")
    data = _dataset_spec(p, where, tab)
    if data is None and "inputs" not in tab:
        raise _err(p, where, "inputs", "is missing", "give inputs, a dataset or random_inputs (docs/ci.md)")
    base_dir = p.resolve().parent
    s = _settings(p, where, tab, defaults)
    s["boards"] = tuple(
        str(base_dir / b) if b.endswith(".toml") and not Path(b).is_absolute() else b for b in s["boards"]
    )
    if not s["boards"]:
        raise _err(p, where, "boards", "is missing (and [defaults] has none): list board types")
    models = _job_models(p, where, base_dir, tab["models"])
    if data is None:
        cases = _job_cases(p, where, base_dir, models, _str_list(p, where, "inputs", tab["inputs"]))
    else:
        cases = _dataset_cases(p, where, base_dir, models, tab)
    return Job(
        name=name,
        cases=tuple(cases),
        boards=s["boards"],
        tolerance_lsb=s["tolerance_lsb"],
        ref_tolerance_lsb=s["ref_tolerance_lsb"],
        comparisons=s["comparisons"],
        timeouts=s["timeouts"],
        retries=s["retries"],
        placement=s["placement"],
        arena_kb=s["arena_kb"],
        input_options=s["input_options"],
        data=data,
    )


def _dataset_spec(p: Path, where: str, tab: Mapping[str, Any]) -> DatasetSpec | None:
    """The job's dataset fields, checked as flash-and-compare checks its options (None: no dataset)."""
    has = [k for k in ("dataset", "random_inputs") if k in tab]
    if not has:
        extra = [k for k in _DATASET_KEYS if k in tab]
        if extra:
            raise _err(p, where, extra[0], "needs 'dataset' or 'random_inputs' in the same job")
        return None
    if len(has) == 2:
        raise _err(p, where, "random_inputs", "and 'dataset' exclude each other", "split them into two jobs")
    if "inputs" in tab:
        raise _err(p, where, has[0], "and 'inputs' exclude each other", "split them into two jobs")
    if "dataset" in tab and (not isinstance(tab["dataset"], str) or not tab["dataset"]):
        raise _err(p, where, "dataset", f"must be a path (got {tab['dataset']!r})")
    if "labels" in tab and (
        "random_inputs" in tab or not isinstance(tab["labels"], str) or not tab["labels"]
    ):
        raise _err(
            p, where, "labels", "must be a path, and only with 'dataset' (random inputs have no labels)"
        )
    results = tab.get("results", "full")
    if results not in ("full", "crc"):
        raise _err(p, where, "results", f"must be 'full' or 'crc', not {results!r}")
    n = None
    if "random_inputs" in tab:
        n = _int(p, where, "random_inputs", tab["random_inputs"], 1)
        if n > 100_000:
            raise _err(p, where, "random_inputs", f"must be <= 100000, not {n}")
    seed = _int(p, where, "seed", tab.get("seed", 0))
    if seed > 2**64 - 1:
        raise _err(p, where, "seed", "must fit in 64 bits")
    repeat = _int(p, where, "repeat", tab.get("repeat", 1), 1)
    if repeat > 1000:
        raise _err(p, where, "repeat", f"must be <= 1000, not {repeat}")
    return DatasetSpec(random_inputs=n, seed=seed, results=results, repeat=repeat)


def _dataset_cases(
    p: Path, where: str, base_dir: Path, models: list[Path], tab: Mapping[str, Any]
) -> list[ModelCase]:
    """Each model with its dataset and labels paths ('{model}' = the model's file stem, literally)."""

    def resolve(key: str, m: Path) -> Path | None:
        if key not in tab:
            return None
        if "{model}" in tab[key] and m.stem in (".", ".."):
            raise _err(p, where, "models", f"has a model file named {m.name!r}: no stem for '{{model}}'")
        path = Path(tab[key].replace("{model}", m.stem)).expanduser()
        return path if path.is_absolute() else base_dir / path

    cases = [ModelCase(m, (), resolve("dataset", m), resolve("labels", m)) for m in models]
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise _err(p, where, "models", "lists two models with the same file name; split them into two jobs")
    return cases


def _job_models(p: Path, where: str, base_dir: Path, value: object) -> list[Path]:
    models: list[Path] = []
    for pattern in _str_list(p, where, "models", value):
        found = _expand(base_dir, pattern, None)
        if not found:
            raise _err(
                p,
                where,
                "models",
                f"entry {pattern!r} matches no file",
                "paths are relative to the plan file",
            )
        models.extend(found)
    return list(dict.fromkeys(models))


def _job_cases(
    p: Path, where: str, base_dir: Path, models: list[Path], input_patterns: list[str]
) -> list[ModelCase]:
    """Each model with its inputs ('{model}' in a pattern = the model's file stem)."""
    from harness.firmware.generate import MAX_INPUTS

    cases: list[ModelCase] = []
    for m in models:
        if m.stem in (".", "..") and any("{model}" in x for x in input_patterns):
            raise _err(
                p,
                where,
                "models",
                f"has a model file named {m.name!r}, whose stem {m.stem!r} cannot stand "
                "for '{model}' in a path",
                "rename the model file",
            )
        files: list[Path] = []
        for pattern in input_patterns:
            found = _expand(base_dir, pattern, m.stem)
            if not found:
                raise _err(
                    p,
                    where,
                    "inputs",
                    f"entry {pattern!r} matches no file for model {m.name}",
                    "paths are relative to the plan file; '{model}' stands for the model's file stem",
                )
            files.extend(found)
        files = list(dict.fromkeys(files))
        if len(files) > MAX_INPUTS:
            raise _err(
                p, where, "inputs", f"gives {len(files)} inputs for {m.name}; one firmware holds {MAX_INPUTS}"
            )
        cases.append(ModelCase(m, tuple(files)))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise _err(p, where, "models", "lists two models with the same file name; split them into two jobs")
    return cases


def _check_job_files(path: Path, job: Job) -> None:
    """Models parse, inputs fit their model, board types exist: usage errors before any build."""
    from harness.firmware.boards import load_board
    from harness.model.inputs import InputOptions, load_input
    from harness.model.loader import load_model

    where = f"job {job.name!r}"
    for b in job.boards:
        try:
            load_board(b)
        except EspCheckError as exc:
            raise _err(
                path, where, "boards", f"names an unknown board type {b!r}: {exc.message}", exc.hint
            ) from None
    options = InputOptions(**job.input_options)
    for case in job.cases:
        try:
            info = load_model(case.model)
        except EspCheckError as exc:
            raise _err(path, where, "models", f"has an unusable model: {exc.message}", exc.hint) from None
        if len(info.inputs) != 1:
            raise _err(
                path,
                where,
                "models",
                f"{case.model.name} has {len(info.inputs)} input tensors; one is supported",
            )
        if job.data is not None:
            _check_dataset(path, where, job, case, info, options)
        for f in case.inputs:
            try:
                load_input(f, info.inputs[0], options)
            except EspCheckError as exc:
                raise _err(
                    path, where, "inputs", f"{f.name} does not fit {case.model.name}: {exc.message}", exc.hint
                ) from None


def dataset_options(job: Job, case: ModelCase) -> Any:
    """The flash-and-compare DatasetOptions of a dataset job's case (None for a job of input files)."""
    from harness.flows.dataset import DatasetOptions

    if job.data is None:
        return None
    d = job.data
    return DatasetOptions(case.dataset, d.random_inputs, d.seed, d.results, case.labels, d.repeat)


def _check_dataset(path: Path, where: str, job: Job, case: ModelCase, info: Any, options: Any) -> None:
    """The case's dataset loads for its model (missing path, bad files, bad labels: here, not later)."""
    from harness.flows.dataset import load_inputs

    for key, f in (("dataset", case.dataset), ("labels", case.labels)):
        if f is not None and not f.exists():
            raise _err(
                path, where, key, f"{f} does not exist (for model {case.model.name})",
                "paths are relative to the plan file; '{model}' stands for the model's file stem",
            )  # fmt: skip
    field_name = "dataset" if case.dataset is not None else "random_inputs"
    try:
        load_inputs(dataset_options(job, case), info.inputs[0], options)
    except EspCheckError as exc:
        raise _err(
            path, where, field_name, f"does not fit {case.model.name}: {exc.message}", exc.hint
        ) from None
