"""Test plans (``esp-check run PLAN.toml``): which models, inputs, board types, tolerances, comparisons.

A plan is validated completely before anything is built or flashed; every error is a
:class:`~harness.errors.PlanError` (exit 2) naming the file, the job and the field. Format and
examples: docs/ci.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError

from harness.errors import EspCheckError, PlanError
from harness.firmware.boards import load_board
from harness.firmware.generate import MAX_INPUTS
from harness.model.inputs import InputOptions, load_input
from harness.model.loader import ModelInfo, load_model
from harness.resources import read_toml

if TYPE_CHECKING:
    from harness.flows.dataset import DatasetOptions

from harness.inprocess import NAME_RE
from harness.userfiles import (
    Loc,
    Strings,
    UserModel,
    field_path,
    one_or_many,
    problem,
    validated,
)

# comparison names in the plan -> (a, b) source-label pairs of harness.analysis.compare
Comparison = Literal["optimized-vs-ansi", "optimized-vs-host", "ansi-vs-host", "each-vs-host"]
COMPARISONS: dict[str, tuple[tuple[str, str], ...]] = {
    "optimized-vs-ansi": (("optimized", "ansi"),),
    "optimized-vs-host": (("optimized", "reference"),),
    "ansi-vs-host": (("ansi", "reference"),),
    "each-vs-host": (("optimized", "reference"), ("ansi", "reference")),
}
Placement = Literal["any", "each"]
Name = Annotated[str, Field(pattern=NAME_RE.pattern, description="letters, digits, '_', '.', '-'")]
Seconds = Annotated[float, Field(gt=0)]
_DATASET_KEYS = ("dataset", "random_inputs", "seed", "results", "labels", "repeat", "keep_chunks")


class Timeouts(UserModel):
    """Per-stage limits in seconds (mapped onto harness.flows.records.StageTimeouts)."""

    build: Seconds = 1800.0
    capture_total: Seconds = 180.0
    capture_silence: Seconds = 30.0


def _input_options(table: InputOptionsTable) -> InputOptionsTable:
    try:
        InputOptions(**table.model_dump(exclude_unset=True))
    except EspCheckError as exc:
        raise ValueError(f"is invalid: {exc.message}") from None
    return table


class InputOptionsTable(UserModel):
    """``input_options``: flash-and-compare's --resize/--color/... (harness.model.inputs.InputOptions)."""

    resize: str | None = Field(None, json_schema_extra={"enum": ["error", "stretch", "crop", "pad"]})
    color: str | None = Field(None, json_schema_extra={"enum": ["auto", "rgb", "grayscale"]})
    scale: float | None = None
    offset: float | None = None
    value_range: str | None = Field(None, json_schema_extra={"enum": ["0..1", "-1..1", "0..255"]})
    raw_dtype: str | None = None


class JobSettings(UserModel):
    """The job fields ``[defaults]`` may set for every job (defaults here are the plan's defaults)."""

    boards: Strings = Field((), description="board type names (boards/*.toml) or board-file paths")
    tolerance_lsb: float = Field(0.0, ge=0, description="optimized vs ANSI C, in LSB")
    ref_tolerance_lsb: float = Field(0.0, ge=0, description="each device variant vs the host, in LSB")
    comparisons: Annotated[
        tuple[Comparison, ...], Field(strict=False, min_length=1), BeforeValidator(one_or_many)
    ] = ("optimized-vs-ansi", "each-vs-host")
    timeouts: Timeouts = Timeouts()
    retries: int = Field(2, ge=0, description="per task, infrastructure failures only")
    placement: Placement = Field("any", description="any: one free board per type; each: every board")
    arena_kb: Annotated[int, Field(ge=1)] | None = None
    input_options: Annotated[InputOptionsTable, AfterValidator(_input_options)] = InputOptionsTable()
    allow_untested: bool = Field(
        False, description="run a model in which ESP-NN accelerates no op on the board's chip (its verdict "
        "then says ESP-NN was not tested); without it such a job is refused before anything runs",
    )  # fmt: skip


class JobTable(JobSettings):
    """One ``[[job]]`` table as written."""

    name: Name
    models: Strings = Field(description="model files or globs, relative to the plan file")
    inputs: Strings | None = Field(None, description="input files or globs; '{model}' is the model's stem")
    dataset: Annotated[str, Field(min_length=1)] | None = None
    random_inputs: Annotated[int, Field(ge=1, le=100_000)] | None = None
    seed: int = Field(0, ge=0, le=2**64 - 1)
    results: Literal["full", "crc"] = "full"
    labels: Annotated[str, Field(min_length=1)] | None = None
    repeat: int = Field(1, ge=1, le=1000)
    keep_chunks: Literal["auto", "always", "never"] = Field(
        "auto", description="a dataset larger than the board's kept-input store, as --keep-chunks"
    )


class RunSettings(UserModel):
    """Plan-wide ``[run]`` settings (retry backoff, quarantine threshold, lock wait)."""

    backoff_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)
    quarantine_after: int = Field(3, ge=1)
    lock_timeout_s: float = Field(600.0, ge=0)


class PlanFile(UserModel):
    """A plan file (``esp-check run PLAN.toml``) as written. Format: docs/ci.md ("Plan file")."""

    schema_version: Literal[1] = 1
    run: RunSettings = RunSettings()
    defaults: JobSettings = JobSettings()
    job: list[JobTable] = Field(min_length=1)


_D = JobSettings()  # Job's defaults are the plan's


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

    random_inputs: int | None
    seed: int
    results: str
    repeat: int
    keep_chunks: str = "auto"


@dataclass(frozen=True)
class Job:
    """One ``[[job]]`` table, with paths resolved and defaults applied."""

    name: str
    cases: tuple[ModelCase, ...]
    boards: tuple[str, ...]  # board type names (boards/*.toml) or board-file paths
    tolerance_lsb: float = _D.tolerance_lsb
    ref_tolerance_lsb: float = _D.ref_tolerance_lsb
    comparisons: tuple[str, ...] = _D.comparisons
    timeouts: Timeouts = _D.timeouts
    retries: int = _D.retries
    placement: str = _D.placement  # any: one free board per type; each: every inventory board of the type
    arena_kb: int | None = _D.arena_kb
    input_options: InputOptions | None = None
    data: DatasetSpec | None = None  # a dataset job: each case streams its dataset (or random inputs)
    allow_untested: bool = _D.allow_untested

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(a, b) source pairs to report, in a stable order without duplicates."""
        return tuple(dict.fromkeys(p for c in self.comparisons for p in COMPARISONS[c]))

    @property
    def needs_reference(self) -> bool:
        return any(b == "reference" for _, b in self.pairs)


@dataclass(frozen=True)
class Plan:
    path: Path
    jobs: tuple[Job, ...]
    run: RunSettings = field(default_factory=RunSettings)


@dataclass(frozen=True)
class At:
    """Where in a user's file a problem is: ``where`` is top level, a [table], job 'J', board 'B'."""

    path: Path
    where: str
    kind: ClassVar[str] = "plan"
    hint: ClassVar[str] = "see docs/ci.md ('Plan file') for every field"

    def err(self, fieldname: str, msg: str, hint: str | None = None) -> PlanError:
        """A PlanError: "KIND FILE: WHERE: field 'F' MSG" (KIND: plan, inventory)."""
        return PlanError(
            f"{self.kind} {self.path}: {self.where}: field '{fieldname}' {msg}", hint=hint or self.hint
        )

    @classmethod
    def entry(cls, path: Path, data: Mapping[str, object], loc: Loc) -> At:
        """Entry ``loc[1]`` of the array of tables ``loc[0]`` (job, board): by the name written in it when
        that is a valid name and not the field at fault, else by its number."""
        table, i = str(loc[0]), int(loc[1])
        entries = data.get(table)
        entry = entries[i] if isinstance(entries, list) and 0 <= i < len(entries) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        valid = isinstance(name, str) and NAME_RE.fullmatch(name) and loc[2] != "name"
        return cls(path, f"{table} {name!r}" if valid else f"{table} #{i + 1}")

    def board_ref(self, ref: str) -> str:
        """A board type as this file names it: a built-in name, or a .toml path relative to the file."""
        relative = ref.endswith(".toml") and not Path(ref).is_absolute()
        return str(self.path.resolve().parent / ref) if relative else ref

    @contextlib.contextmanager
    def wrap(self, fieldname: str, what: str) -> Iterator[None]:
        """An EspCheckError in the block as this error: "field 'F' WHAT: ITS MESSAGE", with its hint."""
        try:
            yield
        except EspCheckError as exc:
            raise self.err(fieldname, f"{what}: {exc.message}", exc.hint) from None


_UNKNOWN = {
    "": "is not a plan field",
    "run": "is not a run setting",
    "defaults": "is not a default job field",
    "job": "is not a job field",
    **{f"{t}.timeouts": "is not a known timeout" for t in ("defaults", "job")},
    **{f"{t}.input_options": "is not an input option" for t in ("defaults", "job")},
}


def _plan_error(plan_path: Path, data: Mapping[str, object], exc: ValidationError) -> PlanError:
    """The first problem pydantic found, as "plan FILE: WHERE: field 'F' ..." (WHERE: a table or job)."""
    loc, msg, hint = problem(exc, PlanFile, _UNKNOWN)
    name, entry = field_path(loc[2:] if loc[0] == "job" and len(loc) > 2 else loc[1:])
    if loc[0] == "job" and len(loc) > 2:
        return At.entry(plan_path, data, loc).err(name, entry + msg, hint)
    if loc[0] == "job" and len(loc) == 2:
        return At(plan_path, f"job #{int(loc[1]) + 1}").err("job", "must be a table")
    if loc[0] == "job":
        return At(plan_path, "top level").err("job", f"{msg}: a plan needs at least one [[job]] table")
    if loc[0] in ("run", "defaults") and len(loc) > 1:
        return At(plan_path, f"[{loc[0]}]").err(name, entry + msg, hint)
    return At(plan_path, "top level").err(str(loc[0]), msg, hint)


def _overlay(defaults: JobSettings, table: JobTable) -> JobSettings:
    """The job's settings: what the job sets, else what ``[defaults]`` sets (timeouts key by key)."""
    given = {k: getattr(table, k) for k in table.model_fields_set & set(JobSettings.model_fields)}
    if "timeouts" in given:
        own = {k: getattr(table.timeouts, k) for k in table.timeouts.model_fields_set}
        given["timeouts"] = defaults.timeouts.model_copy(update=own)
    return defaults.model_copy(update=given)


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


def load_plan(path: str | Path, *, check_files: bool = True) -> Plan:
    """Read and validate a plan; raises PlanError (exit 2) naming file, job and field.

    With ``check_files`` every model is parsed and every input glob must match at least one file
    for every model of its job, so a typo fails here and not after an hour of builds.
    """
    p = Path(path)
    data = read_toml(p, "plan", "docs/examples/plan.toml")
    plan = validated(PlanFile, data, lambda exc: _plan_error(p, data, exc))
    jobs: list[Job] = []
    for table in plan.job:
        job = _job(p, table, plan.defaults, {j.name for j in jobs})
        if check_files:
            _check_job_files(p, job)
        jobs.append(job)
    return Plan(path=p, jobs=tuple(jobs), run=plan.run)


def _job(plan_path: Path, table: JobTable, defaults: JobSettings, seen: set[str]) -> Job:
    """One ``[[job]]`` table: its settings over the defaults, board types, models and their inputs."""
    at = At(plan_path, f"job {table.name!r}")
    if table.name in seen:
        raise at.err("name", "is used by two jobs; job names must be unique")
    data = _dataset_spec(at, table)
    if data is None and table.inputs is None:
        raise at.err("inputs", "is missing", "give inputs, a dataset or random_inputs (docs/ci.md)")
    base_dir = plan_path.resolve().parent
    s = _overlay(defaults, table)
    boards = tuple(at.board_ref(b) for b in s.boards)
    if not boards:
        raise at.err("boards", "is missing (and [defaults] has none): list board types")
    models = _job_models(at, base_dir, table.models)
    if table.inputs is not None:
        cases = _job_cases(at, base_dir, models, list(table.inputs))
    else:
        cases = _dataset_cases(at, base_dir, models, table)
    if len({c.name for c in cases}) != len(cases):
        raise at.err("models", "lists two models with the same file name; split them into two jobs")
    settings = {k: getattr(s, k) for k in JobSettings.model_fields if k not in ("boards", "input_options")}
    given = s.input_options.model_dump(exclude_unset=True)
    return Job(
        name=table.name,
        cases=tuple(cases),
        boards=boards,
        input_options=InputOptions(**given) if given else None,
        data=data,
        **settings,
    )


def _dataset_spec(at: At, table: JobTable) -> DatasetSpec | None:
    """The job's dataset fields, checked as flash-and-compare checks its options (None: no dataset)."""
    given = table.model_fields_set
    has = [k for k in ("dataset", "random_inputs") if k in given]
    if not has:
        extra = [k for k in _DATASET_KEYS if k in given]
        if extra:
            raise at.err(extra[0], "needs 'dataset' or 'random_inputs' in the same job")
        return None
    if len(has) == 2:
        raise at.err("random_inputs", "and 'dataset' exclude each other", "split them into two jobs")
    if table.inputs is not None:
        raise at.err(has[0], "and 'inputs' exclude each other", "split them into two jobs")
    if table.labels is not None and table.random_inputs is not None:
        raise at.err("labels", "must be a path, and only with 'dataset' (random inputs have no labels)")
    return DatasetSpec(**table.model_dump(include={f.name for f in dataclasses.fields(DatasetSpec)}))


_NO_STEM = "has a model file named {!r}, whose stem {!r} cannot stand for '{{model}}' in a path"
_RELATIVE = "paths are relative to the plan file; '{model}' stands for the model's file stem"


def _dataset_cases(at: At, base_dir: Path, models: list[Path], table: JobTable) -> list[ModelCase]:
    """Each model with its dataset and labels paths ('{model}' = the model's file stem, literally)."""

    def resolve(pattern: str | None, model: Path) -> Path | None:
        if pattern is None:
            return None
        _check_stem(at, model, [pattern])
        path = Path(pattern.replace("{model}", model.stem)).expanduser()
        return path if path.is_absolute() else base_dir / path

    return [ModelCase(m, (), resolve(table.dataset, m), resolve(table.labels, m)) for m in models]


def _check_stem(at: At, model: Path, patterns: list[str]) -> None:
    if model.stem in (".", "..") and any("{model}" in p for p in patterns):  # it would name a directory
        raise at.err("models", _NO_STEM.format(model.name, model.stem), "rename the model file")


def _job_models(at: At, base_dir: Path, patterns: tuple[str, ...]) -> list[Path]:
    models: list[Path] = []
    for pattern in patterns:
        found = _expand(base_dir, pattern, None)
        if not found:
            raise at.err(
                "models", f"entry {pattern!r} matches no file", "paths are relative to the plan file"
            )
        models.extend(found)
    return list(dict.fromkeys(models))


def _job_cases(at: At, base_dir: Path, models: list[Path], input_patterns: list[str]) -> list[ModelCase]:
    """Each model with its inputs ('{model}' in a pattern = the model's file stem)."""
    cases: list[ModelCase] = []
    for m in models:
        _check_stem(at, m, input_patterns)
        files: list[Path] = []
        for pattern in input_patterns:
            found = _expand(base_dir, pattern, m.stem)
            if not found:
                raise at.err("inputs", f"entry {pattern!r} matches no file for model {m.name}", _RELATIVE)
            files.extend(found)
        files = list(dict.fromkeys(files))
        if len(files) > MAX_INPUTS:
            raise at.err("inputs", f"gives {len(files)} inputs for {m.name}; one firmware holds {MAX_INPUTS}")
        cases.append(ModelCase(m, tuple(files)))
    return cases


def _check_job_files(path: Path, job: Job) -> None:
    """Models parse, inputs fit their model, board types exist: usage errors before any build."""
    at = At(path, f"job {job.name!r}")
    for b in job.boards:
        with at.wrap("boards", f"names an unknown board type {b!r}"):
            load_board(b)
    options = job.input_options or InputOptions()
    for case in job.cases:
        with at.wrap("models", "has an unusable model"):
            info = load_model(case.model)
        if len(info.inputs) != 1:
            raise at.err(
                "models", f"{case.model.name} has {len(info.inputs)} input tensors; one is supported"
            )
        if job.data is not None:
            _check_dataset(at, job, case, info, options)
        for f in case.inputs:
            with at.wrap("inputs", f"{f.name} does not fit {case.model.name}"):
                load_input(f, info.inputs[0], options)


def dataset_options(job: Job, case: ModelCase) -> DatasetOptions | None:
    """The flash-and-compare DatasetOptions of a dataset job's case (None for a job of input files)."""
    # lazy: the pipeline (pyserial's tools, rich: ~50 ms) loads when a task runs, not for `bench detect`
    from harness.flows.dataset import DatasetOptions

    d = job.data
    if d is None:
        return None
    return DatasetOptions(
        case.dataset, d.random_inputs, d.seed, d.results, case.labels, d.repeat, chunks=d.keep_chunks
    )


def _check_dataset(at: At, job: Job, case: ModelCase, info: ModelInfo, options: InputOptions) -> None:
    """The case's dataset loads for its model (missing path, bad files, bad labels: here, not later)."""
    from harness.flows.dataset import load_inputs  # lazy: the pipeline, as in dataset_options

    for key, f in (("dataset", case.dataset), ("labels", case.labels)):
        if f is not None and not f.exists():
            raise at.err(key, f"{f} does not exist (for model {case.model.name})", _RELATIVE)
    field_name = "dataset" if case.dataset is not None else "random_inputs"
    data = dataset_options(job, case)
    assert data is not None  # called for dataset jobs only
    with at.wrap(field_name, f"does not fit {case.model.name}"):
        load_inputs(data, info.inputs[0], options)
