"""One exception root for esp-check, one subclass family per layer.

Every error says what failed and how to fix it (``hint``). Only ``harness.cli.main`` turns them into
process exit codes; library code raises, never exits.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Iterable


class ExitCode(enum.IntEnum):
    """Process exit codes (documented in README.md)."""

    MATCH = 0
    MISMATCH = 1
    USAGE = 2
    INFRASTRUCTURE = 3
    FIRMWARE_FAULT = 4
    INTERNAL = 70
    INTERRUPTED = 130  # Ctrl-C / SIGINT: the run did not finish (128 + SIGINT, the shell convention)
    TERMINATED = 143  # SIGTERM (timeout(1), docker stop, a CI cancel): handled as Ctrl-C is (128 + SIGTERM)


class StrEnum(str, enum.Enum):
    """A string enum whose ``str()`` is its value, as Python 3.11's ``enum.StrEnum`` (this runs on 3.10)."""

    def __str__(self) -> str:
        return self.value


class Verdict(StrEnum):
    """The one verdict vocabulary of every report (compare, flash-and-compare, run), from the exit code."""

    MATCH = "match"
    MISMATCH = "mismatch"
    USAGE_ERROR = "usage_error"
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    FIRMWARE_FAULT = "firmware_fault"
    INTERNAL_ERROR = "internal_error"
    INTERRUPTED = "interrupted"
    # one input of a dataset (a run's verdict is one of the above, from its exit code): its two runs gave
    # different outputs; the device reported an error for it; a leg's result is missing
    NONDETERMINISTIC = "nondeterministic"
    DEVICE_ERROR = "device_error"
    INCOMPLETE = "incomplete"

    @property
    def exit_code(self) -> ExitCode:
        """The exit code this verdict stands for."""
        return _EXIT_OF[self]

    @classmethod
    def from_exit_code(cls, code: ExitCode | int) -> Verdict:
        return _VERDICT_OF.get(int(code), cls.INTERNAL_ERROR)  # an ExitCode is equal to its int


_VERDICT_OF: dict[int, Verdict] = {
    ExitCode.MATCH: Verdict.MATCH,
    ExitCode.MISMATCH: Verdict.MISMATCH,
    ExitCode.USAGE: Verdict.USAGE_ERROR,
    ExitCode.INFRASTRUCTURE: Verdict.INFRASTRUCTURE_ERROR,
    ExitCode.FIRMWARE_FAULT: Verdict.FIRMWARE_FAULT,
    ExitCode.INTERRUPTED: Verdict.INTERRUPTED,
    ExitCode.TERMINATED: Verdict.INTERRUPTED,
}
_EXIT_OF = {
    **{v: ExitCode(c) for c, v in _VERDICT_OF.items() if c != ExitCode.TERMINATED},
    Verdict.INTERNAL_ERROR: ExitCode.INTERNAL,
    Verdict.NONDETERMINISTIC: ExitCode.MISMATCH,
    Verdict.DEVICE_ERROR: ExitCode.FIRMWARE_FAULT,
    Verdict.INCOMPLETE: ExitCode.INFRASTRUCTURE,
}


# When one run has several outcomes, the most important one decides the exit code.
EXIT_PRECEDENCE: tuple[ExitCode, ...] = (
    ExitCode.TERMINATED,
    ExitCode.INTERRUPTED,
    ExitCode.INTERNAL,
    ExitCode.USAGE,
    ExitCode.FIRMWARE_FAULT,
    ExitCode.MISMATCH,
    ExitCode.INFRASTRUCTURE,
    ExitCode.MATCH,
)


def combine_exit_codes(codes: Iterable[ExitCode | int]) -> ExitCode:
    """Pick the exit code of a run with several outcomes: 2, then 4, then 1, then 3, then 0.

    An empty iterable is a MATCH only in the trivial sense; callers must not compare nothing.
    """
    return min((ExitCode(int(c)) for c in codes), key=EXIT_PRECEDENCE.index, default=ExitCode.MATCH)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread by ``harness.cli.main``'s handler, so a run stops as on
    Ctrl-C (its ``finally`` blocks and ``except KeyboardInterrupt`` reports run) and exits 143. Not an
    error of esp-check's: like KeyboardInterrupt, it is outside the ``EspCheckError`` family."""


def stopped_by(exc: KeyboardInterrupt) -> tuple[ExitCode, str]:
    """A run stopped by Ctrl-C or SIGTERM: its exit code (130 / 143) and how reports say it."""
    if isinstance(exc, Terminated):
        return ExitCode.TERMINATED, "interrupted (SIGTERM)"
    return ExitCode.INTERRUPTED, "interrupted (Ctrl-C)"


class EspCheckError(Exception):
    """Root of every error esp-check raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nHint: {self.hint}"
        return self.message


# --- usage / input errors (exit 2) -------------------------------------------------------------


class UsageError(EspCheckError):
    """The user asked for something impossible or gave bad input."""

    exit_code = ExitCode.USAGE


class ModelError(UsageError):
    """The .tflite file is unreadable, corrupt, or uses something esp-check/TFLM cannot run."""


class ReferenceRefusedError(ModelError):
    """TFLM's reference interpreter aborted (SIGABRT) inside Invoke: a kernel check refuses these values.

    Alone it is a model error (exit 2). ``flash-and-compare`` catches it and still runs both variants:
    the device's esp-nn kernels may return values where the reference refuses (docs/flash-and-compare.md).
    """

    def __init__(self, message: str, *, hint: str | None = None, run: int | None = None) -> None:
        super().__init__(message, hint=hint)
        self.run = run  # the input run it aborted on; None: the zero-input arena probe


class InputDataError(UsageError):
    """An input file cannot be read or does not fit the model's input tensor."""


class LogFormatError(UsageError):
    """A log/result file given to ``compare`` holds no usable outputs."""


class BoardDefinitionError(UsageError):
    """A board TOML file is missing, malformed or has an invalid field."""


class PlanError(UsageError):
    """A test plan or inventory file is invalid."""


class GenerateError(UsageError):
    """The firmware project cannot be generated (e.g. the arena fits in no memory of the board)."""


class IncomparableError(UsageError):
    """Two runs cannot be compared honestly (same ESP-NN mode, identical firmware, other model...)."""


# --- infrastructure errors (exit 3) -----------------------------------------------------------


class InfrastructureError(EspCheckError):
    """Something between the host and the device failed: tooling, port, link, timeout."""

    exit_code = ExitCode.INFRASTRUCTURE


class BuildError(InfrastructureError):
    """The firmware build failed or its tooling is missing."""


class PlatformUnreachableError(BuildError):
    """The build tool could not download its platform, toolchain or components (offline): every other
    build of the same tool would fail the same way, so a run stops building with it after the first."""


class PortError(InfrastructureError):
    """A serial port is missing, busy, or not accessible."""


class FlashError(InfrastructureError):
    """esptool could not sync, write or verify."""


class CaptureError(InfrastructureError):
    """The serial capture was silent, truncated or corrupted (CRC): never a result."""


class DiskFullError(InfrastructureError):
    """No space left (or the quota reached) where esp-check writes: a host problem, exit 3."""


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


def write_error(exc: OSError, what: str) -> InfrastructureError:
    """The error for an OSError while writing ``what`` (a log, a report): a full disk says so and how
    to fix it; anything else names the file and the system's reason. Both are exit 3."""
    where = f"{exc.filename} ({what})" if exc.filename and str(exc.filename) not in what else what
    if exc.errno in DISK_FULL_ERRNOS:
        return DiskFullError(
            f"no space left on the device while writing {where}",
            hint="free space on that disk, or give --out a directory on another one",
        )
    return InfrastructureError(
        f"cannot write {where}: {exc.strerror or exc}",
        hint="check that the directory is writable and its disk healthy",
    )


class HostReferenceError(InfrastructureError):
    """The host reference could not run (backend missing or crashed)."""


class BoardBusyError(InfrastructureError):
    """A board lock could not be taken in time."""


class LabgridError(InfrastructureError):
    """labgrid-client failed: coordinator unreachable, place unknown, resource missing."""


def exit_code_for(exc: BaseException) -> ExitCode:
    """Exit code for an exception reaching ``main``: unknown exceptions are internal errors (70)."""
    return exc.exit_code if isinstance(exc, EspCheckError) else ExitCode.INTERNAL
