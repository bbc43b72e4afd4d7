from harness.cli import main
from harness.errors import (
    CaptureError,
    ExitCode,
    FirmwareFaultError,
    InputDataError,
    combine_exit_codes,
    exit_code_for,
)


def test_precedence_usage_then_fault_then_mismatch_then_infra() -> None:
    E = ExitCode
    assert combine_exit_codes([E.MATCH, E.INFRASTRUCTURE, E.MISMATCH]) == E.MISMATCH
    assert combine_exit_codes([E.MISMATCH, E.FIRMWARE_FAULT]) == E.FIRMWARE_FAULT
    assert combine_exit_codes([E.FIRMWARE_FAULT, E.USAGE, E.INFRASTRUCTURE]) == E.USAGE
    assert combine_exit_codes([E.MATCH, E.INFRASTRUCTURE]) == E.INFRASTRUCTURE
    assert combine_exit_codes([E.MATCH, E.MATCH]) == E.MATCH


def test_exception_exit_codes_and_hint() -> None:
    assert exit_code_for(InputDataError("x")) == ExitCode.USAGE
    assert exit_code_for(CaptureError("x")) == ExitCode.INFRASTRUCTURE
    assert exit_code_for(FirmwareFaultError("x")) == ExitCode.FIRMWARE_FAULT
    assert exit_code_for(ValueError("x")) == ExitCode.INTERNAL
    assert "Hint: do y" in str(InputDataError("x failed", hint="do y"))


def test_main_unknown_command_is_usage_error() -> None:
    assert main(["no-such-command"]) == ExitCode.USAGE


def test_main_version_exits_zero() -> None:
    assert main(["--version"]) == 0
