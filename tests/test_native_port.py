"""The native board's port (``native://``): install ("flash"), reset, stream, end of program.

What is real: pyserial's URL dispatch (``serial_for_url``), the device layer's DeviceSession, open_port,
the DTR/RTS reset sequences of esp-pylib, the console capture thread and the classifier, and small
host programs compiled here with the host C compiler (the board's "firmware"). Nothing is faked.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import serial

from harness.analysis.classify import classify
from harness.device.ports import Transport, open_port, resolve_port
from harness.device.protocol_native import EXIT_LINE, ProgramEnded, exit_line, register
from harness.device.session import DeviceSession
from harness.errors import PortError

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(CC is None, reason="no host C compiler")]

PROGRAM = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    static int boots;
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("hello from %s\r\n", MODE);
    if (strcmp(MODE, "echo") == 0) {
        char line[64];
        if (fgets(line, sizeof line, stdin)) printf("got %s", line);
        return 0;
    }
    if (strcmp(MODE, "segv") == 0) raise(SIGSEGV);
    if (strcmp(MODE, "exit3") == 0) { fprintf(stderr, "oops on stderr\n"); return 3; }
    if (strcmp(MODE, "forever") == 0) { for (;;) { printf("tick\r\n"); usleep(20000); } }
    printf("@EC1 0 END status=ok records=0 *00000000\r\n");
    (void)boots; (void)argc; (void)argv;
    return 0;
}
"""
BOARD = type("B", (), {"chip": "esp32", "console": "uart", "reset": "classic", "monitor_baud": 115200})()


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("native-programs")
    (d / "p.c").write_text(PROGRAM)
    out = {}
    assert CC is not None
    for mode in ("ok", "echo", "segv", "exit3", "forever"):
        exe = d / mode
        subprocess.run([CC, f'-DMODE="{mode}"', str(d / "p.c"), "-o", str(exe)], check=True)
        out[mode] = exe
    return out


def test_url_resolves_to_the_native_transport_and_opens_through_pyserial() -> None:
    ps = resolve_port("native://bench-1")
    assert ps.transport == Transport.NATIVE and ps.caps.local_reset and ps.caps.disconnect_is_eof
    port = open_port(ps)
    try:
        assert type(port).__module__ == "harness.device.protocol_native" and port.name == "bench-1"
        assert port.read(10) == b""  # nothing flashed, nothing runs: a blank board is silent
    finally:
        port.close()
    register()
    with pytest.raises(serial.SerialException, match="native://NAME"):
        serial.serial_for_url("native://bad name!")


def test_a_native_name_ending_in_a_newline_is_refused() -> None:
    """``--port`` (or an inventory's ``port``) as esp-check opens it: resolve_port strips only the URL's
    ends, so before a query the name kept its newline ('bench\\n'), which ``^...$`` with ``.match`` let
    through (``$`` matches before a final newline) into the board's directory, lock and log lines."""
    with pytest.raises(PortError, match="native://NAME"):
        open_port(resolve_port("native://bench\n?flash=4MB")).close()


@pytest.mark.parametrize("query", ["flash=4MB%0A", "flash=4M\nB"])
def test_a_flash_size_with_a_newline_is_refused(query: str) -> None:
    """``flash=`` is one size like 4MB: ``^...MB$`` with ``.match`` let ``4MB%0A`` (decoded: a final
    newline) through, and urlsplit dropped a newline typed inside the query, so a size that is not the
    one written opened as 4MB. Faked: nothing (a native board of this process)."""
    with pytest.raises(PortError, match="is not a flash size like 4MB"):
        open_port(resolve_port(f"native://t-flash-nl?{query}")).close()


def test_a_reset_blank_board_says_so_and_its_stream_ends(tmp_path: Path) -> None:
    """Reset into the app with nothing flashed: the boot stand-in prints why nothing starts and the stream
    ends (a capture, the HELLO probe before a flash among them, ends there instead of at its silence
    limit). Faked: nothing (the native board of this process, blank)."""
    with DeviceSession("native://t-blank", BOARD) as dev:
        cap = dev.capture(tmp_path / "serial.log", total_timeout=20, silence_timeout=10)
    assert cap.ended_by == "disconnect" and cap.resets == 1, cap
    assert cap.data == b"esp-check native boot: no partition table: nothing is flashed\r\n"


def test_flash_then_capture_runs_the_installed_copy(programs: dict[str, Path], tmp_path: Path) -> None:
    exe = tmp_path / "fw"
    shutil.copy2(programs["ok"], exe)
    with DeviceSession("native://t-ok", BOARD) as dev:
        fr = dev.flash([(0, exe)], log_path=tmp_path / "flash.log")
        assert fr.chip == "native" and fr.regions[0].bytes_written == exe.stat().st_size
        assert "installed fw" in (tmp_path / "flash.log").read_text()
        exe.unlink()  # the board keeps what was flashed, whatever happens to the build
        cap = dev.capture(tmp_path / "serial.log", total_timeout=20, silence_timeout=5)
    assert cap.ended_by == "end_record" and cap.resets == 1
    assert cap.data.startswith(b"hello from ok\r\n") and b"END status=ok" in cap.data
    assert (tmp_path / "serial.log").read_bytes() == cap.data


def test_a_second_reset_restarts_the_program_and_drops_old_output(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    with DeviceSession("native://t-forever", BOARD) as dev:
        dev.flash([(0, programs["forever"])])
        first = dev.capture(total_timeout=0.5, silence_timeout=5)
        second = dev.capture(total_timeout=0.5, silence_timeout=5)
    for cap in (first, second):
        assert cap.ended_by == "timeout" and cap.data.startswith(b"hello from forever\r\ntick")
        assert cap.data.count(b"hello") == 1  # one boot per reset, nothing left over from the last one


@pytest.mark.parametrize(
    ("mode", "line", "kind"),
    [
        ("segv", f"{EXIT_LINE} was killed by signal 11 (SIGSEGV)", "native_exit"),
        ("exit3", f"{EXIT_LINE} exited with status 3", "native_exit"),
    ],
)
def test_an_abnormal_end_is_reported_and_ends_the_stream(
    programs: dict[str, Path], mode: str, line: str, kind: str
) -> None:
    with DeviceSession(f"native://t-{mode}", BOARD) as dev:
        dev.flash([(0, programs[mode])])
        cap = dev.capture(total_timeout=20, silence_timeout=10)
    assert cap.ended_by == "disconnect" and cap.duration_s < 10  # no waiting for a silence timeout
    text = cap.data.decode()
    assert text.startswith(f"hello from {mode}") and text.rstrip().endswith(line)
    if mode == "exit3":
        assert "oops on stderr" in text  # stderr is part of the stream (sanitizer reports go there)
    findings = classify(cap.data, ended_by=cap.ended_by)
    assert [f.kind for f in findings] == [kind]  # not a "disconnect": the program's end is the finding
    assert findings[0].exit_code == 4


def test_a_clean_exit_without_end_is_a_disconnect_not_a_fault(tmp_path: Path) -> None:
    assert exit_line(0) is None
    src = tmp_path / "q.c"
    src.write_text('#include <stdio.h>\nint main(void) { puts("bye"); return 0; }\n')
    assert CC is not None
    subprocess.run([CC, str(src), "-o", str(tmp_path / "q")], check=True)
    with DeviceSession("native://t-quiet", BOARD) as dev:
        dev.flash([(0, tmp_path / "q")])
        cap = dev.capture(total_timeout=20, silence_timeout=10)
    assert cap.ended_by == "disconnect" and cap.data == b"bye\n"
    assert [f.kind for f in classify(cap.data, ended_by=cap.ended_by)] == ["disconnect"]


def test_writes_reach_the_programs_stdin(programs: dict[str, Path]) -> None:
    port = open_port("native://t-echo")
    try:
        port.install(programs["echo"])
        port.dtr, port.rts = False, True  # EN low (classic circuit)
        port.rts = False  # EN released with IO0 high: boot
        assert port.write(b"ping\n") == 5
        data = b""
        with pytest.raises(ProgramEnded):
            for _ in range(400):
                data += port.read(64)
        assert data == b"hello from echo\r\ngot ping\n"
    finally:
        port.close()


def test_exit_lines_name_the_signal() -> None:
    assert exit_line(-6) == f"{EXIT_LINE} was killed by signal 6 (SIGABRT)\r\n"
    assert exit_line(1) == f"{EXIT_LINE} exited with status 1\r\n"
    assert "unknown signal" in str(exit_line(-200))


def test_a_port_without_flash_has_4mb_and_one_place_says_so(tmp_path: Path) -> None:
    """native://NAME without flash= is a 4 MB board: 16 bytes end at 4 MB, one byte further does not fit.
    The default is written once, in the URL's parse (protocol_native has no second constant for it).
    Faked: nothing (a native board of this process)."""
    import harness.device.protocol_native as native

    assert not hasattr(native, "DEFAULT_FLASH_BYTES")
    blob = tmp_path / "b.bin"
    blob.write_bytes(bytes(16))
    port = open_port(resolve_port("native://t-default-flash"))
    try:
        assert port.write_region((4 << 20) - 16, blob)[0] == 16
        with pytest.raises(OSError, match="beyond the board's 4 MB of flash"):
            port.write_region((4 << 20) - 15, blob)
    finally:
        port.close()


@pytest.mark.parametrize("name", ["a", "a" * 64, "a" * 65, "-a", ".a", "_a", "a.b-c_D9", "a b", "a!b", "é"])
def test_a_native_boards_name_follows_the_plans_name_rule(name: str) -> None:
    """``native://NAME``, ``sim://NAME`` and a plan's names are one rule (harness.inprocess.NAME_RE): a name
    the plan accepts opens, one it refuses is refused with the native port's own message. Faked: nothing (a
    native board of this process, no program)."""
    from pydantic import TypeAdapter, ValidationError

    from harness.runner.plan import Name

    register()  # native:// in pyserial's URL handlers, as opening a port through harness.device does
    try:
        TypeAdapter(Name).validate_python(name)
    except ValidationError:
        with pytest.raises(serial.SerialException, match="expected native://NAME"):
            serial.serial_for_url(f"native://{name}", do_not_open=True).open()
        return
    port = serial.serial_for_url(f"native://{name}", do_not_open=True)
    port.open()
    port.close()
