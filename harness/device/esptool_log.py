"""Route esptool's log output to a per-flash sink instead of stdout.

How (a router in esptool's process-wide logger, one sink per flashing thread) and its known limit:
docs/device.md, "Ports and transports".
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TextIO

from esp_pylib.logger import EspLog, EspLogBase
from rich.text import Text


def _plain(args: tuple[object, ...]) -> str:
    """Join log arguments and drop rich markup (esptool escapes dynamic text with rich's escape)."""
    text = " ".join(str(a) for a in args)
    if "[" not in text:
        return text
    try:
        return Text.from_markup(text).plain
    except Exception:  # malformed markup: keep the raw text rather than lose the message
        return text


class EsptoolLogSink:
    """Collects one flash run's esptool messages: lines in memory, optionally to a file (progress-bar
    updates: :meth:`progress`, for a subclass to use)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.lines: list[str] = []
        self._partial = ""
        self._stream = stream

    def write(self, text: str, end: str = "\n") -> None:
        *lines, self._partial = (self._partial + text + end).split("\n")
        for line in lines:
            self._emit(line)

    def _emit(self, line: str) -> None:
        line = line.rstrip("\r")
        self.lines.append(line)
        if self._stream is not None:
            self._stream.write(line + "\n")
            self._stream.flush()

    def progress(self, current: int, total: int, prefix: str) -> None:
        """A progress-bar update (current, total, description): not kept here."""

    def flush(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = ""

    def text(self) -> str:
        return "\n".join(self.lines + ([self._partial] if self._partial else []))


class _ThreadSink(threading.local):
    sink: EsptoolLogSink | None = None  # this thread's


class _Router(EspLogBase):
    """The one logger installed into esptool: per-thread sink, else the previous logger."""

    def __init__(self, fallback: EspLogBase | None) -> None:
        self._fallback = fallback if fallback is not None else EspLog()
        self._local = _ThreadSink()

    def print(self, *args: object, **kwargs: object) -> None:
        sink = self._local.sink
        if sink is None:
            self._fallback.print(*args, **kwargs)
            return
        sink.write(_plain(args), end=str(kwargs.get("end", "\n")))

    def _tagged(
        self, tag: str, args: tuple[object, ...], fallback: Callable[..., None], **kw: object
    ) -> None:
        sink = self._local.sink
        if sink is None:
            fallback(*args, **kw)
            return
        suggestion = kw.get("suggestion")
        sink.write(f"{tag}{_plain(args)}" + (f" ({suggestion})" if suggestion else ""))

    def err(self, *args: object, suggestion: str | None = None) -> None:
        self._tagged("Error: ", args, self._fallback.err, suggestion=suggestion)

    def warn(self, *args: object, suggestion: str | None = None) -> None:
        self._tagged("Warning: ", args, self._fallback.warn, suggestion=suggestion)

    # esptool still calls the historical names on its logger
    def warning(self, message: str, suggestion: str | None = None) -> None:
        self.warn(message, suggestion=suggestion)

    def error(self, message: str, suggestion: str | None = None) -> None:
        self.err(message, suggestion=suggestion)

    def note(self, *args: object) -> None:
        self._tagged("Note: ", args, self._fallback.note)

    def hint(self, *args: object) -> None:
        self._tagged("Hint: ", args, self._fallback.hint)

    def debug(self, *args: object) -> None:
        if self._local.sink is None:
            self._fallback.debug(*args)

    def stage(self, finish: bool = False) -> None:
        if self._local.sink is None:
            self._fallback.stage(finish=finish)

    def set_verbosity(self, mode: int | str) -> None:
        self._fallback.set_verbosity(mode)

    def set_info_stream(self, stream: object) -> None:
        self._fallback.set_info_stream(stream)

    def progress_bar(
        self, cur_iter: int, total_iters: int, prefix: str = "", suffix: str = "", bar_length: int = 30
    ) -> None:
        sink = self._local.sink
        if sink is None:
            self._fallback.progress_bar(cur_iter, total_iters, prefix, suffix, bar_length)
            return
        sink.progress(cur_iter, total_iters, prefix)

    def counter_line(self, prefix: str, suffix: str, *, final: bool = False) -> None:
        if self._local.sink is None:
            self._fallback.counter_line(prefix, suffix, final=final)


_install_lock = threading.Lock()


def _router() -> _Router:
    with _install_lock:
        current = EspLog.instance
        if isinstance(current, _Router):
            return current
        router = _Router(current)
        EspLog.set_logger(router)
        return router


@contextlib.contextmanager
def capture_esptool_log(sink: EsptoolLogSink) -> Iterator[EsptoolLogSink]:
    """Send esptool's messages from this thread to ``sink`` for the duration of the block."""
    router = _router()
    previous, router._local.sink = router._local.sink, sink
    try:
        yield sink
    finally:
        sink.flush()
        router._local.sink = previous
