"""The job spec: what one check is (model, inputs or dataset, target, tolerances, build options,
features, reports). Every mode builds one and hands it to :func:`harness.flows.flash_and_compare.run_job`.

Why the options travel as one object: docs/architecture.md "The pipeline: one job spec, one path".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.firmware.native.project import NativeOptions
from harness.flows.dataset import DatasetOptions
from harness.flows.records import StageTimeouts
from harness.model.inputs import InputOptions

if TYPE_CHECKING:
    from harness.firmware.boards import Board
    from harness.flows.firmware import Firmware
    from harness.flows.targets import Target


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """How a check runs: every field has the CLI's default (``esp-check flash-and-compare --help``)."""

    # judging
    tolerance_lsb: float = 0
    ref_tolerance_lsb: float = 0
    reference: bool = True  # run the host reference (the third witness)
    allow_untested: bool = False  # run a model in which ESP-NN accelerates no op on the chip
    # inputs
    input_options: InputOptions | None = None
    dataset: DatasetOptions | None = None  # a whole dataset instead of the job's inputs
    # building
    builder: str | None = None
    cache_dir: str | Path | None = None
    arena_kb: int | None = None
    native: NativeOptions | None = None  # native boards' builds (docs/native.md)
    timeouts: StageTimeouts = field(default_factory=StageTimeouts)
    # the board
    flash_baud: int | None = None
    lock: bool = True  # hold the board's cross-process lock while flashing and capturing
    lock_dir: str | Path | None = None
    lock_timeout: float = 600.0
    # features
    tap: bool = False
    dump_ops: tuple[int, ...] = ()
    # reports beside report.json
    junit: str | Path | None = None
    html: str | Path | None = None
    bundle: str | Path | None = None

    def replace(self, **changes: object) -> JobOptions:
        """A copy with ``changes`` (dataclasses.replace, typed for callers)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class JobSpec:
    """One check: the model, its inputs (empty for a dataset job), the board, its port, the artifacts."""

    model: Path
    inputs: tuple[Path, ...] = ()
    board: str | Path | Board = "sim"
    port: str | None = None
    out_dir: Path = Path("esp-check-out")
    options: JobOptions = field(default_factory=JobOptions)
    # what an earlier step already has, so the job does not make it again (docs/architecture.md
    # "Targets"): the target it opened (hybrid's baseline board) and the runner's built firmware
    target: Target | None = None
    firmware: Firmware | None = None

    @classmethod
    def of(
        cls,
        model: str | Path,
        inputs: Sequence[str | Path] = (),
        *,
        board: str | Path | Board = "sim",
        port: str | None = None,
        out_dir: str | Path = "esp-check-out",
        options: JobOptions | None = None,
    ) -> JobSpec:
        return cls(
            Path(model), tuple(Path(p) for p in inputs), board, port, Path(out_dir), options or JobOptions()
        )
