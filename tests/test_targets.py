"""Targets (harness/flows/targets.py): which class a board and port make, the ports each refuses before
anything is built, its lock policy, and the network probe that runs before the builds.

Nothing is faked: real board files, real sockets on 127.0.0.1; the full job runs only where a port is
refused (so nothing is built).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from harness.errors import ExitCode, UsageError
from harness.firmware.boards import Board, load_board
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.hybrid import hybrid
from harness.flows.job import JobOptions
from harness.flows.targets import (
    TARGETS,
    NativeTarget,
    RealTarget,
    ServedSimTarget,
    SimTarget,
    Target,
    open_target,
)

MODEL = "cnn_classifier_11.tflite"
INPUT = "inputs/cnn_classifier_11__ambiguous.png"


def _closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("board", "port", "kind", "url_start", "private"),
    [
        ("sim", None, SimTarget, "sim://esp-check-", True),
        ("sim", "sim://bench1?fault=panic", SimTarget, "sim://bench1?fault=panic&chip=", False),
        ("sim", "rfc2217://127.0.0.1:4000", ServedSimTarget, "rfc2217://127.0.0.1:4000", False),
        ("native-esp32", None, NativeTarget, "native://esp-check-", True),
        ("native-esp32", "native://pc-1", NativeTarget, "native://pc-1", False),
        ("esp32s3-devkitc-1-n8", None, RealTarget, "auto", False),
        ("esp32s3-devkitc-1-n8", "rfc2217://lab:4000", RealTarget, "rfc2217://lab:4000", False),
        ("esp32s3-devkitc-1-n8", "/dev/ttyUSB0", RealTarget, "/dev/ttyUSB0", False),
    ],
)
def test_board_and_port_choose_the_target(
    board: str, port: str | None, kind: type, url_start: str, private: bool
):
    t = open_target(load_board(board), port)
    assert type(t) is kind and t.port_url.startswith(url_start) and t.private is private
    assert t.meaning == {SimTarget: "SIMULATED", ServedSimTarget: "SIMULATED", NativeTarget: "NATIVE"}.get(
        kind, ""
    )
    # a board made for this job alone is nobody else's: no lock; any other board is locked
    lock = t.lock(lock_dir=None, timeout=1.0, owner="test", on_wait=lambda m: None)
    assert (lock is None) is private


@pytest.mark.parametrize(
    ("board", "port", "words"),
    [
        ("sim", "/dev/ttyUSB0", "not a simulator's port"),
        ("sim", "socket://127.0.0.1:4000", "raw TCP"),
        ("sim", "native://pc-1", "not a simulator's port"),
        ("native-esp32", "sim://x", "not a native:// port"),
        ("esp32s3-devkitc-1-n8", "sim://x", "is a real board"),
        ("esp32s3-devkitc-1-n8", "native://x", "is a real board"),
    ],
)
def test_a_port_the_target_cannot_use_is_refused_at_once(board: str, port: str, words: str):
    with pytest.raises(UsageError, match=words):
        open_target(load_board(board), port)


def test_a_network_port_nobody_answers_is_exit_3_before_anything_is_built(models_dir: Path, tmp_path: Path):
    """``rfc2217://`` of a server that is not running: the job stops at the port check, in seconds, with
    no generate or build stage, and its report says why (before, two builds ran first)."""
    url = f"rfc2217://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    result = flash_and_compare(
        models_dir / MODEL, [models_dir / INPUT], board="esp32s3-devkitc-1-n8", port=url,
        out_dir=tmp_path / "out", options=JobOptions(reference=False),
    )  # fmt: skip
    assert result.exit_code == ExitCode.INFRASTRUCTURE
    assert any("nothing answers there" in e for e in result.errors), result.errors
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    stages = [s["stage"] for s in doc["stages"]]
    assert "port-present" in stages and not {"generate", "build"} & set(stages), stages
    assert doc["exit_code"] == ExitCode.INFRASTRUCTURE
    assert time.monotonic() - t0 < 60  # not a bound on speed: proof that no build (minutes) ran


def test_the_network_probe_leaves_the_server_free(tmp_path: Path):
    """The probe connects and closes: a server that takes one client at a time can take the job's next."""
    from harness.device.ports import check_present, resolve_port

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        url = f"rfc2217://127.0.0.1:{srv.getsockname()[1]}"
        check_present(resolve_port(url))
        conn, _ = srv.accept()
        with conn:
            assert conn.recv(1) == b""  # the probe closed its end: the slot is free
        check_present(resolve_port(url.replace("rfc2217", "socket")))  # socket:// is probed the same way


def test_whether_a_target_is_simulated_is_said_once():
    """Regression: ``Target.simulated`` repeated ``expects_sim`` (two names that could drift apart); a
    report's ``simulated`` now reads ``expects_sim``, the one the judge holds the BEGIN record to."""
    for cls in (Target, *TARGETS):
        assert "simulated" not in dir(cls), cls
    assert [cls.expects_sim for cls in TARGETS] == [False, True, True, False]


def test_both_simulators_share_their_reach_rules_by_inheritance():
    """Regression: ServedSimTarget borrowed SimTarget's ``refusal``/``check_url`` by assignment, so they ran
    as SimTarget's (``cls`` was the wrong class). Both now inherit them from one base."""
    board = load_board("sim")
    for cls in (SimTarget, ServedSimTarget):
        assert cls.refusal.__self__ is cls and cls.check_url.__self__ is cls
        raw = cls.refuse_reach(board, "port", "socket://127.0.0.1:4000")
        assert raw is not None and raw[0].startswith("is raw TCP"), raw
        bad = cls.refuse_reach(board, "port", "sim://x?fault=no_such_fault")
        assert bad is not None and "not a valid sim:// URL" in bad[0], bad
        assert cls.refuse_reach(board, "port", "rfc2217://127.0.0.1:4000") is None


def test_hybrid_opens_its_target_once(models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Regression: hybrid's baseline opened the target through run_job, then opened another one to find
    the same port again. Real: the job up to its port check (nothing answers, nothing is built); the
    target class's ``make`` is wrapped only to count its calls."""
    made: list[str | None] = []
    real = ServedSimTarget.make

    def counting(board: Board, port: str | None) -> Target:
        made.append(port)
        return real(board, port)

    monkeypatch.setattr(ServedSimTarget, "make", counting)
    url = f"rfc2217://127.0.0.1:{_closed_port()}"
    res = hybrid(models_dir / MODEL, [models_dir / INPUT], board="sim", port=url, out_dir=tmp_path / "h")
    assert res.exit_code == ExitCode.INFRASTRUCTURE and res.port == url, (res.exit_code, res.errors)
    assert made == [url]
