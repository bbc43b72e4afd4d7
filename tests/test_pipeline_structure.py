"""The shape of the one pipeline, kept by tests: a job is one spec, configuration travels by name, and
the kind of target is decided by the target classes, not by branches spread over the flows.

These read harness/ with :mod:`ast` (nothing runs); each rule says why it exists.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from harness import api
from harness.flows import flash_and_compare as pipeline
from harness.flows.hybrid import hybrid
from harness.flows.job import JobOptions, JobSpec

HARNESS = Path(__file__).resolve().parents[1] / "harness"

# Calls whose callee takes *args by design: a binary layout, a table row, a C function through ctypes.
VARARGS = re.compile(r"(^|\.)(pack|pack_into|add_row)$|^(self\.)?lib\.")

# A branch on the KIND of target: a board definition's kind, a transport's name, or a port URL's scheme.
# Reading a result's ``simulated`` flag to label it is not one (the result says what it is).
KIND = re.compile(
    r"(board\w*|bench|\bb)\.(simulated|is_native)|Transport\.(SIM|NATIVE)\b"
    r"|['\"](sim|native|rfc2217|socket)://|== ['\"](sim|native)['\"]"
)
# Where the kinds live: the target classes, and the simulated and native boards themselves.
KIND_HOMES = ("flows/targets.py", "sim/", "device/protocol_native.py")
MAX_KIND_BRANCHES = 10


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(HARNESS)), ast.parse(p.read_text(encoding="utf-8"))) for p in HARNESS.rglob("*.py")
    ]


def test_the_main_entry_points_take_at_most_8_parameters() -> None:
    """Everything beyond model, inputs, board, port and artifacts travels in one JobOptions."""
    for fn in (api.flash_and_compare, pipeline.flash_and_compare, hybrid, pipeline.run_job):
        params = inspect.signature(fn).parameters
        assert len(params) <= 8, f"{fn.__qualname__} takes {len(params)} parameters: {list(params)}"


def test_every_flash_and_compare_option_is_a_job_option() -> None:
    """A JobOptions field for each knob the CLI has (so the API reaches all of them), with its default."""
    fields = set(JobOptions.__dataclass_fields__)
    for knob in (
        "tolerance_lsb",
        "reference",
        "tap",
        "dump_ops",
        "dataset",
        "native",
        "junit",
        "lock_timeout",
    ):
        assert knob in fields
    spec = JobSpec.of("m.tflite", ["a.npy"], board="sim", out_dir="o")
    assert spec.options == JobOptions() and spec.inputs == (Path("a.npy"),)
    with pytest.raises(TypeError):
        JobOptions(tolerance=1)  # type: ignore[call-arg]  # a misspelt option is an error, not ignored


def test_no_call_in_harness_passes_more_than_6_positional_arguments() -> None:
    """Seven values in a row are read by position alone: a swapped pair type-checks and runs wrong."""
    found = []
    modules = _modules()
    # harness's own functions that take *args (a C call's pieces, a list of click options) are exempt too
    star = {
        n.name for _, t in modules for n in ast.walk(t) if isinstance(n, ast.FunctionDef) and n.args.vararg
    }
    for rel, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) > 6:
                name = ast.unparse(node.func)
                if not VARARGS.search(name) and name not in star:
                    found.append(f"{rel}:{node.lineno} {name}({len(node.args)} positional)")
    assert not found, "pass these by keyword:\n" + "\n".join(sorted(found))


def test_branches_on_the_kind_of_target_live_in_the_target_classes() -> None:
    """Real, simulated, served and native boards are classes (flows/targets.py): what differs between
    them is a method there, not an ``if`` in a flow. A few kind checks remain elsewhere (the board file's
    own validation, the builder choice, labels): at most ten."""
    found = []
    for rel, tree in _modules():
        if rel.startswith(KIND_HOMES):
            continue
        for node in ast.walk(tree):
            tests = [node.test] if isinstance(node, ast.If | ast.IfExp | ast.While) else []
            tests += node.ifs if isinstance(node, ast.comprehension) else []
            found += [f"{rel}:{t.lineno} {ast.unparse(t)[:80]}" for t in tests if KIND.search(ast.unparse(t))]
    assert len(found) <= MAX_KIND_BRANCHES, "\n".join(sorted(found))


def test_the_counting_rules_can_fail() -> None:
    """The two AST rules above see what they are meant to see (a rule that finds nothing proves nothing)."""
    tree = ast.parse("if board.simulated:\n    f(1, 2, 3, 4, 5, 6, 7)\nx = 1 if url == 'sim://' else 2\n")
    ifs = [n for n in ast.walk(tree) if isinstance(n, ast.If | ast.IfExp)]
    assert all(KIND.search(ast.unparse(n.test)) for n in ifs) and len(ifs) == 2
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and len(n.args) > 6]
    assert len(calls) == 1 and not VARARGS.search(ast.unparse(calls[0].func))
    assert VARARGS.search("struct.pack") and VARARGS.search("self.lib.ecp_tensor")


def test_the_firmware_steps_take_the_job_options_whole() -> None:
    """Regression: generate/build/prepare_firmware took the build options one by one (builder, cache_dir,
    timeout, native, arena_kb, input_options), so each caller unpacked a JobOptions field by field."""
    from harness.flows.firmware import build_firmware, generate_firmware, prepare_firmware

    fields = {f.name for f in dataclasses.fields(JobOptions)} | {"timeout"}
    for fn in (generate_firmware, build_firmware, prepare_firmware):
        params = set(inspect.signature(fn).parameters)
        assert "options" in params and not params & fields, (fn.__name__, params & fields)
