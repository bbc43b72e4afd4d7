"""The work a plan's tasks share, done once before the board workers start.

Without it, the first task on every board starts at the same moment: each simulated board compiles
the protocol's C library, and every worker builds or waits for a firmware and a host reference that
another worker is making. :func:`prepare_shared` makes each distinct firmware (per model, board type
and options: the runner's build memo) and each distinct host reference once, a few at a time, then
the workers start on warm work. A failure here is kept by the runner's memo and reported by the task
that needs it, exactly as if the task had met it; nothing is retried or hidden.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from harness.errors import EspCheckError
from harness.flows.targets import target_class
from harness.runner.results import BoardStatus

if TYPE_CHECKING:
    from harness.runner.executor import Runner


def _shared_jobs(runner: Runner) -> list[Callable[[], object]]:
    """One callable per distinct piece of shared work of the tasks that can run on a usable board."""
    jobs: list[Callable[[], object]] = []
    seen: set[Hashable] = set()
    usable = {b.bench.board.name: b.bench.board for b in runner.boards.values() if b.status == BoardStatus.OK}
    if any(target_class(board).expects_sim for board in usable.values()):  # their loop runs the C codec
        jobs.append(_codec_library)
    for t in runner.tasks:
        board = usable.get(t.board_type)
        if board is None or t.job.data is not None:  # dataset jobs build inside their flow
            continue
        options = t.job.input_options
        key = ("fw", str(t.case.model), t.board_type, options, t.job.arena_kb, board.console)
        if key not in seen:
            seen.add(key)
            jobs.append(functools.partial(runner._firmware, t, board))
        ref_key = ("ref", str(t.case.model), tuple(map(str, t.case.inputs)), options)
        if t.job.needs_reference and ref_key not in seen:
            seen.add(ref_key)
            jobs.append(functools.partial(runner._reference, t))
    return jobs


def _codec_library() -> None:
    """The C library every simulated board's firmware loop runs (compiled once per source hash)."""
    from harness.protocol.emitter import build_c_library, find_c_compiler

    if find_c_compiler() is not None:
        build_c_library()


def _quietly(job: Callable[[], object], runner: Runner) -> None:
    if runner.stop.is_set():
        return
    with contextlib.suppress(EspCheckError):  # memoized by the runner: the task that needs it reports it
        job()


def prepare_shared(runner: Runner, workers: int | None = None) -> int:
    """Build each distinct firmware and host reference of ``runner``'s plan once; returns how many
    pieces of work there were. A stop starts no more of them; a hard stop (a second Ctrl-C) stops
    waiting for the running ones, as the board workers' join does (the threads are daemons, like the
    board workers, so nothing they run holds the process open)."""
    jobs = _shared_jobs(runner)
    if not jobs:
        return 0
    runner.say(f"[prepare] {len(jobs)} shared build(s) and reference(s) before the boards start")
    todo: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
    for job in jobs:
        todo.put(job)

    def worker() -> None:
        while True:
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            _quietly(job, runner)

    threads = [
        threading.Thread(target=worker, name=f"prepare-{k}", daemon=True)
        for k in range(min(len(jobs), workers or min(4, os.cpu_count() or 1)))
    ]
    for th in threads:
        th.start()
    for th in threads:
        while th.is_alive() and not runner.hard_stop.is_set():
            th.join(timeout=0.2)
    return len(jobs)
