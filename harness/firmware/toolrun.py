"""Run a build tool as an argument list (never a shell), teeing its output to a log and a callback.

The time limit is on **silence**, not on total time, and a stop kills the tool's whole process group
(docs/native.md "Build time and its limit"); ninja's ``[n/N]`` progress goes to the callback as
``esp-check:`` notes.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness import children
from harness.errors import BuildError

OutputCallback = Callable[[str], None]
NOTE = "esp-check: "  # lines esp-check adds to a tool's output (progress, waits), not the tool's own
PROGRESS_EVERY_S = 30.0
_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


def notes_only(callback: Callable[[str], None]) -> OutputCallback:
    """An output callback that passes on esp-check's own notes (progress, lock waits), prefix removed."""

    def forward(line: str) -> None:
        if line.startswith(NOTE):
            callback(line[len(NOTE) :])

    return forward


class _Progress:
    """ninja's ``[n/N]`` steps as a note every PROGRESS_EVERY_S seconds (and at the last step)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = time.monotonic()
        self.last = -PROGRESS_EVERY_S

    def note(self, line: str) -> str | None:
        m = _STEP.match(line)
        if not m:
            return None
        n, total = int(m.group(1)), int(m.group(2))
        now = time.monotonic() - self.t0
        if n != total and now - self.last < PROGRESS_EVERY_S and n != 1:
            return None
        self.last = now
        return f"{NOTE}{self.name}: step {n}/{total} ({100 * n // max(total, 1)}%, {now:.0f} s)"


def run_streaming(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    on_output: OutputCallback | None,
    timeout: float | None,
) -> tuple[int, list[str]]:
    """Run ``argv`` (no shell), tee its combined output to ``log_path`` and ``on_output``; keep a tail.

    ``timeout``: seconds without a line of output before the tool and its children are killed
    (BuildError, exit 3); None for no limit."""
    tail: deque[str] = deque(maxlen=400)  # the last lines, for the failure message
    silent = threading.Event()
    finished = threading.Event()
    last_output = [time.monotonic()]
    t0 = time.monotonic()
    name = Path(argv[0]).name
    with log_path.open("a", encoding="utf-8") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        try:
            proc = children.start(
                argv,
                group=True,
                cwd=str(cwd),
                env=dict(env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            raise BuildError(
                f"cannot start {argv[0]}: {exc.strerror or exc}",
                hint="check that the build tool is installed",
            ) from exc

        def _watch() -> None:
            assert timeout is not None
            while not finished.wait(min(1.0, timeout / 4)):
                if time.monotonic() - last_output[0] > timeout:
                    silent.set()
                    children.kill(proc, group=True)
                    return

        if timeout:
            threading.Thread(target=_watch, daemon=True).start()
        progress = _Progress(name)
        with children.tracked(proc):  # killed, group and all, if esp-check stops
            try:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    last_output[0] = time.monotonic()
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    log.write(line + "\n")
                    tail.append(line)
                    if on_output is not None:
                        on_output(line)
                        note = progress.note(line)
                        if note:
                            on_output(note)
                rc = proc.wait()
            except BaseException:
                children.kill(proc, group=True)
                proc.wait()
                raise
            finally:
                finished.set()
                # nothing of the group outlives its leader (a compiler left behind)
                children.kill(proc, group=True)
        log.write(f"[exit code {rc}]\n")
    if silent.is_set():
        raise BuildError(
            f"{name} printed nothing for {timeout:.0f} s and was killed, with its child processes "
            f"({time.monotonic() - t0:.0f} s after it started)",
            hint=f"see {log_path}; a build that prints nothing that long is stuck, or the machine is "
            "overloaded: raise the build time-out (it counts silence, not total time)",
        )
    return rc, list(tail)
