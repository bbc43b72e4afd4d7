"""The public Python API: what the CLI, the CI runner and Python users call.

Plain functions and dataclasses; errors are :class:`harness.errors.EspCheckError` subclasses that carry
the exit code the CLI would use. Example::

    from harness import api
    info = api.load_model("model.tflite")
    result = api.flash_and_compare("model.tflite", ["img.png"], board="sim", out_dir="out")
    print(result.verdict, result.exit_code)
"""

from __future__ import annotations

from harness.build import BuildResult, build_project
from harness.compare import CompareResult, compare_files, compare_sources, load_source, reference_source
from harness.errors import EspCheckError, ExitCode, combine_exit_codes
from harness.flow import FlashAndCompareResult, StageTimeouts, flash_and_capture, flash_and_compare
from harness.generate import GeneratedProject, generate_projects
from harness.inputs import InputOptions, PreparedInput, load_input
from harness.model import ModelInfo, OpInfo, TensorInfo, load_model
from harness.protocol import Capture, parse_capture
from harness.reference import ReferenceResult, run_reference

__all__ = [
    "BuildResult",
    "Capture",
    "CompareResult",
    "EspCheckError",
    "ExitCode",
    "FlashAndCompareResult",
    "GeneratedProject",
    "InputOptions",
    "ModelInfo",
    "OpInfo",
    "PreparedInput",
    "ReferenceResult",
    "StageTimeouts",
    "TensorInfo",
    "build_project",
    "combine_exit_codes",
    "compare_files",
    "compare_sources",
    "flash_and_capture",
    "flash_and_compare",
    "generate_projects",
    "load_input",
    "load_model",
    "load_source",
    "parse_capture",
    "reference_source",
    "run_reference",
]
