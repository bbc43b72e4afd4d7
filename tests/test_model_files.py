"""A path that is not a regular file, or is absurdly large, is refused (exit 2)
before a byte is read, for models (`inspect`, `flash-and-compare`), `compare`'s captures, inputs and
datasets.

Nothing is faked: the CLI runs in a child process (a FIFO would block an in-process read forever; the
child's timeout turns the old hang into a failure), on real FIFOs, /dev/zero and sparse files.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.errors import ExitCode, InputDataError, LogFormatError, ModelError
from harness.model.files import LOG_MAX_BYTES, MODEL_MAX_BYTES, read_regular

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
ROOT = Path(__file__).resolve().parent.parent


def _limit_memory() -> None:  # the old code grew without end on /dev/zero: keep the child small
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory if sys.platform != "win32" else None,
        check=False,
    )


@needs_fifo
def test_inspect_and_compare_refuse_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "m.tflite"
    os.mkfifo(fifo)
    res = _cli("inspect", str(fifo), "--no-arena", cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "FIFO" in res.stderr and "refused before reading" in res.stderr
    log = tmp_path / "a.log"
    os.mkfifo(log)
    res = _cli("compare", str(log), str(log), cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "FIFO" in res.stderr


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_inspect_refuses_dev_zero(tmp_path: Path) -> None:
    res = _cli("inspect", "/dev/zero", "--no-arena", cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "character device" in res.stderr


def test_an_absurd_capture_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with big.open("wb") as fh:  # sparse: the size is real, the disk cost is not
        fh.truncate(LOG_MAX_BYTES + 1)
    res = _cli("compare", str(big), str(big), cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "MiB" in res.stderr and "cut the log" in res.stderr


def test_read_regular_caps_models_and_reads_regular_files(tmp_path: Path) -> None:
    model = tmp_path / "huge.tflite"
    with model.open("wb") as fh:
        fh.truncate(MODEL_MAX_BYTES + 1)
    with pytest.raises(ModelError, match="more than the 64 MiB"):
        from harness.model.loader import load_model

        load_model(model)
    ok = tmp_path / "ok.bin"
    ok.write_bytes(b"abc")
    assert read_regular(ok, what="file", max_bytes=3) == b"abc"
    with pytest.raises(LogFormatError, match="is a directory"):
        read_regular(tmp_path, what="capture", max_bytes=10, error=LogFormatError)


@needs_fifo
def test_inputs_and_datasets_refuse_fifos(tmp_path: Path) -> None:
    from harness.model.dataset import load_dataset
    from harness.model.inputs import load_input
    from harness.model.loader import TensorInfo

    tensor = TensorInfo(0, "in", (1, 4), "int8", 0.5, 0)
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)
    with pytest.raises(InputDataError, match="FIFO"):
        load_input(fifo, tensor)
    folder = tmp_path / "d"
    (folder / "cat").mkdir(parents=True)
    np.save(folder / "cat" / "a.npy", np.zeros((1, 4), np.int8))
    os.mkfifo(folder / "cat" / "b.npy")  # named like an input: refused, never skipped silently
    with pytest.raises(InputDataError, match="FIFO"):
        load_dataset(folder, tensor)
    for name in ("set.npz", "set.txt"):
        os.mkfifo(tmp_path / name)
        with pytest.raises(InputDataError, match="FIFO"):
            load_dataset(tmp_path / name, tensor)
