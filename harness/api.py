"""The public Python API: what the CLI, the CI runner and Python users call.

Plain functions and dataclasses; errors are :class:`harness.errors.EspCheckError` subclasses that carry
the exit code the CLI would use. An example: README.md, "Python API".
"""

from __future__ import annotations

from harness.analysis.compare import (
    CompareResult,
    compare_files,
    compare_sources,
    load_source,
    reference_source,
)
from harness.errors import EspCheckError, ExitCode, combine_exit_codes
from harness.firmware.boards import Board, list_boards, load_board
from harness.firmware.build import BuildResult, build_project
from harness.firmware.generate import GeneratedProject, generate_projects
from harness.flows.capture import flash_and_capture
from harness.flows.flash_and_compare import flash_and_compare, run_job
from harness.flows.hybrid import HybridOptions, HybridResult, hybrid
from harness.flows.job import JobOptions, JobSpec
from harness.flows.records import FlashAndCompareResult, StageTimeouts
from harness.flows.sweep import SweepOptions, SweepResult, sweep
from harness.model.arena import ArenaEstimate, estimate_arena
from harness.model.backends import ReferenceResult
from harness.model.inputs import InputOptions, PreparedInput, load_input
from harness.model.loader import ModelInfo, OpInfo, TensorInfo, load_model
from harness.model.reference import run_reference
from harness.protocol.capture import Capture, parse_capture
from harness.runner import RunOptions, RunResult, load_inventory, load_plan, run_plan
from harness.runner.inventory import detect_devices

__all__ = [
    "ArenaEstimate",
    "Board",
    "BuildResult",
    "Capture",
    "CompareResult",
    "EspCheckError",
    "ExitCode",
    "FlashAndCompareResult",
    "GeneratedProject",
    "HybridOptions",
    "HybridResult",
    "InputOptions",
    "JobOptions",
    "JobSpec",
    "ModelInfo",
    "OpInfo",
    "PreparedInput",
    "ReferenceResult",
    "RunOptions",
    "RunResult",
    "StageTimeouts",
    "SweepOptions",
    "SweepResult",
    "TensorInfo",
    "build_project",
    "combine_exit_codes",
    "compare_files",
    "compare_sources",
    "detect_devices",
    "estimate_arena",
    "flash_and_capture",
    "flash_and_compare",
    "generate_projects",
    "hybrid",
    "list_boards",
    "load_board",
    "load_input",
    "load_inventory",
    "load_model",
    "load_plan",
    "load_source",
    "parse_capture",
    "reference_source",
    "run_job",
    "run_plan",
    "run_reference",
    "sweep",
]
