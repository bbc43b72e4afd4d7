"""Generate and build both variants, and refuse firmware that cannot tell the kernels apart.

Who shares it: docs/architecture.md "The pipeline: one job spec, one path".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import EspCheckError, IncomparableError
from harness.firmware.boards import Board
from harness.firmware.build import BuildResult, build_project
from harness.firmware.generate import FirmwareFeatures, GeneratedProject, generate_projects
from harness.firmware.toolrun import notes_only
from harness.flashfmt.partitions import VARIANTS
from harness.flows.records import Recorder

if TYPE_CHECKING:
    from harness.flows.job import JobOptions


@dataclass
class Firmware:
    """Both variants' projects and builds; ``failures`` holds the builds that failed, by variant."""

    projects: dict[str, GeneratedProject]
    builds: dict[str, BuildResult] = field(default_factory=dict)
    failures: dict[str, EspCheckError] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(v in self.builds for v in VARIANTS)


def generate_firmware(
    model: str | Path,
    inputs: Sequence[str | Path],
    board: Board,
    out_dir: Path,
    *,
    rec: Recorder,
    options: JobOptions,
    features: FirmwareFeatures | None = None,
) -> dict[str, GeneratedProject]:
    """Render both variants (a usage error propagates: nothing to flash yet)."""
    projects = rec.run(
        "generate",
        None,
        lambda: generate_projects(
            model,
            list(inputs),
            board,
            out_dir=out_dir,
            input_options=options.input_options,
            arena_kb=options.arena_kb,
            features=features,
        ),
    )
    return {p.variant: p for p in projects}


def build_firmware(
    projects: dict[str, GeneratedProject], *, rec: Recorder, logs_dir: Path, options: JobOptions
) -> Firmware:
    """Build every variant (each its own stage, with ``options``' builder, cache, build timeout and
    native options); IncomparableError for byte-identical images."""
    fw = Firmware(projects)
    for v in VARIANTS:
        project_dir = projects[v].path

        def do_build(project_dir: Path = project_dir, v: str = v) -> BuildResult:
            return build_project(
                project_dir,
                builder=options.builder,
                cache_dir=options.cache_dir,
                log_path=logs_dir / f"build-{v}.log",
                timeout=options.timeouts.build,
                native=options.native,
                on_output=notes_only(functools.partial(rec.say, f"build [{v}]")),  # progress, lock waits
            )

        try:
            fw.builds[v] = rec.run("build", v, do_build)
        except EspCheckError as exc:
            fw.failures[v] = exc
    if fw.complete and fw.builds["optimized"].firmware_sha256 == fw.builds["ansi"].firmware_sha256:
        raise IncomparableError(
            "the optimized and ANSI C builds produced byte-identical firmware: the ESP-NN setting did "
            "not reach the build",
            hint="delete the stale sdkconfig.<env> / sdkconfig in both projects and build again",
        )
    return fw


def prepare_firmware(
    model: str | Path,
    inputs: Sequence[str | Path],
    board: Board,
    out_dir: Path,
    *,
    rec: Recorder,
    options: JobOptions,
    features: FirmwareFeatures | None = None,
    before_build: Callable[[], None] = lambda: None,
) -> Firmware:
    """Generate into ``out_dir/projects`` and build both, build logs in ``out_dir/logs``;
    ``before_build`` runs between the two (host-side checks that must fail before minutes of building)."""
    projects = generate_firmware(
        model, inputs, board, out_dir / "projects", rec=rec, options=options, features=features
    )
    before_build()
    return build_firmware(projects, rec=rec, logs_dir=out_dir / "logs", options=options)
