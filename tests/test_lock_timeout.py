"""``--lock-timeout 0`` / ``lock_timeout_s = 0``: take a free board, skip a held one at once.

Real click parsing, the real plan loader and real file locks (filelock, flock); the labgrid side of
the same rule runs against a real lab in tests/test_labgrid_e2e.py. Nothing is faked.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from held_lock import held_elsewhere

from harness.commands.runner_cmds import run_cmd
from harness.device.locks import BoardLock
from harness.errors import BoardBusyError
from harness.runner import load_plan


def test_the_cli_takes_lock_timeout_0(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text("")
    ctx = run_cmd.make_context("run", [str(plan), "--lock-timeout", "0"])
    assert ctx.params["lock_timeout"] == 0.0
    with pytest.raises(Exception, match="-1"):
        run_cmd.make_context("run", [str(plan), "--lock-timeout", "-1"])


def test_a_plan_takes_lock_timeout_s_0(tmp_path: Path, models_dir: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        textwrap.dedent(f"""
            [run]
            lock_timeout_s = 0

            [[job]]
            name = "j"
            models = ["{models_dir / "op_zoo.tflite"}"]
            random_inputs = 1
            boards = ["sim"]
        """)
    )
    assert load_plan(plan).run.lock_timeout_s == 0.0


def test_a_board_lock_with_timeout_0_takes_a_free_board_and_skips_a_held_one(tmp_path: Path) -> None:
    free = BoardLock("sim-free", tmp_path)
    free.acquire(0)
    assert free.acquired_at is not None
    free.release()
    with held_elsewhere(tmp_path / "sim-held.lock"), pytest.raises(BoardBusyError, match="still in use"):
        BoardLock("sim-held", tmp_path).acquire(0)
