"""Run a build tool as an argument list (never a shell), teeing its output to a log and a callback."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.errors import BuildError

OutputCallback = Callable[[str], None]


def run_streaming(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    on_output: OutputCallback | None,
    timeout: float | None,
) -> tuple[int, list[str]]:
    """Run ``argv`` (no shell), tee its combined output to ``log_path`` and ``on_output``; keep a tail."""
    tail: list[str] = []
    timed_out = threading.Event()
    with log_path.open("a", encoding="utf-8") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv), cwd=str(cwd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            raise BuildError(
                f"cannot start {argv[0]}: {exc.strerror or exc}",
                hint="check that the build tool is installed",
            ) from exc

        def _kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout, _kill) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                log.write(line + "\n")
                tail.append(line)
                if len(tail) > 400:
                    del tail[:100]
                if on_output is not None:
                    on_output(line)
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            if timer:
                timer.cancel()
        log.write(f"[exit code {rc}]\n")
    if timed_out.is_set():
        raise BuildError(
            f"{Path(argv[0]).name} did not finish within {timeout:.0f} s (killed)",
            hint=f"see {log_path}; raise the build timeout for a first build that downloads toolchains",
        )
    return rc, tail
