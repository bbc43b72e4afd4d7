"""A board that resets shows it at once; the host does not wait out a silence limit to find out.

What is faked: the board (``sim://``, harness.sim running the firmware's own C loop, with an injected
crash). Real: esptool flashing, the resident loop's frames, the judge.

- ESP-IDF prints ``Rebooting...`` as the last line before a software reset (a panic, an abort,
  ``esp_restart``), and ``Brownout detector was triggered`` before a brownout reset. The next boot
  starts at the console baud, so a host on the fast link reads only garbage until its silence limit:
  those lines are the restart's evidence.
- A probe boot (is the build already on the board?) that sees a second boot start before the resident
  app's HELLO knows that boot never reached the app: it flashes instead of counting more boot loops.
- Every ``--option`` a hint names is one the CLI has.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from pathlib import Path

import click
import pytest

from harness.errors import ExitCode
from harness.flows.dataset import DatasetOptions
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.sim.board import remove_board

MODEL = "cnn_classifier_11.tflite"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("abort&variant_fault=ansi", ExitCode.FIRMWARE_FAULT),
        ("brownout&variant_fault=optimized", ExitCode.INFRASTRUCTURE),
    ],
)
def test_a_reset_mid_stream_is_a_restart_not_a_silent_board(
    tmp_path: Path, models_dir: Path, fault: str, expected: ExitCode
) -> None:
    name = f"rs-{uuid.uuid4().hex[:8]}"
    # a silence limit far beyond what the run needs: only the reboot line can end the wait in time
    limits = StageTimeouts(capture_total=120, capture_silence=60)
    ds = DatasetOptions(random_inputs=1, seed=3, results="crc")
    try:
        r = flash_and_compare(
            models_dir / MODEL,
            [],
            board="sim",
            port=f"sim://{name}?emitter=c&fault={fault}",
            out_dir=tmp_path / "o",
            options=JobOptions(timeouts=limits, dataset=ds),
        )
    finally:
        remove_board(name)
    assert r.exit_code == expected
    text = r.report_path.read_text()
    assert "the device restarted while esp-check waited" in text
    assert "of silence" not in text  # never taken for a stalled link


def test_a_blank_board_is_probed_for_two_boots_then_flashed(tmp_path: Path, models_dir: Path) -> None:
    name = f"rs-{uuid.uuid4().hex[:8]}"
    try:
        r = flash_and_compare(
            models_dir / MODEL,
            [models_dir / "inputs" / "cnn_classifier_11.png"],
            board="sim",
            port=f"sim://{name}?emitter=c",
            out_dir=tmp_path / "o",
        )
    finally:
        remove_board(name)
    assert r.exit_code == ExitCode.MATCH
    probe = (tmp_path / "o" / "logs" / "boot-probe.log").read_bytes()
    # blank flash: the ROM's boot loop. The probe stops at the second boot start (the rest of the chunk
    # that held it may show a third); it used to wait for four
    assert 2 <= probe.count(b"ESP-ROM:") < 4, probe[-400:]
    report = json.loads(r.report_path.read_text())
    assert report["verdict"] == "match"
    (flash,) = [s for s in report["stages"] if s["stage"] == "flash"]
    assert "no HELLO from an esp-check app" in flash["detail"]  # why it flashed, said in the report
    assert "ended by boot_loop" in flash["detail"], flash["detail"]


def _cli_options(cmd: click.Command) -> set[str]:
    out = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for n in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, n)
            if sub is not None:
                out |= _cli_options(sub)
    return out


# options of other tools that hints name, with the tool in the same hint
OTHER_TOOLS = {"--force-reinstall": "pip install", "--install": "xcode-select"}


def test_every_option_a_hint_names_exists() -> None:
    from harness.cli import cli

    known = _cli_options(cli)
    named: dict[str, list[str]] = {}
    for path in sorted((REPO / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.keyword) and node.arg == "hint"):
                continue
            for s in ast.walk(node.value):
                if isinstance(s, ast.Constant) and isinstance(s.value, str):
                    for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", s.value):
                        if opt in OTHER_TOOLS:
                            assert OTHER_TOOLS[opt] in s.value, (path, opt)
                            continue
                        named.setdefault(opt, []).append(f"{path.relative_to(REPO)}:{s.lineno}")
    assert len(named) > 10  # the scan finds the hints
    missing = {o: where for o, where in named.items() if o not in known}
    assert not missing, f"hints name options the CLI does not have: {missing}"
