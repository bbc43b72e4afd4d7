"""One board, one open serial handle: flash, then capture, without closing in between.

The flash-and-compare orchestration's object (docs/device.md shows its use). The handle may be replaced
during the capture (USB-Serial-JTAG re-enumerates on reset); the session always holds the current one
and closes it on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import serial

from harness.chips import CONSOLE_BAUD, FLASH_BAUD, ROM_BAUD
from harness.device.console import RawCapture, capture_run
from harness.device.flash import FlashFailure, FlashResult, ProgressCallback, RegionResult, flash_artifacts
from harness.device.loop import (
    MAX_RETRANSMITS,
    DeviceRestarted,
    LinkError,
    LinkLost,
    LinkStats,
    LoopClient,
)
from harness.device.ports import (
    BoardLike,
    PortSpec,
    open_port,
    reopen_after_reenumeration,
    resolve_port,
)
from harness.device.protocol_native import Serial as NativeSerial
from harness.protocol import frames


class DeviceSession:
    """A board on a port: resolve, open once, flash, capture, close."""

    def __init__(
        self,
        port: str | PortSpec,
        board: BoardLike | None = None,
        *,
        flash_baud: int | None = None,
        console_baud: int | None = None,
    ) -> None:
        self.spec = port if isinstance(port, PortSpec) else resolve_port(port, board)
        self.board = board
        self.flash_baud = flash_baud or int(getattr(board, "flash_baud", FLASH_BAUD))
        self.console_baud = console_baud or int(getattr(board, "monitor_baud", CONSOLE_BAUD))
        self.reset_style = str(getattr(board, "reset", "classic"))
        self.serial: serial.SerialBase | None = None
        self.link_baud: int | None = None  # the resident loop's switched baud (None: the console baud)
        # repairs seen on the way to a boot (switching the baud, a slot switch's BOOT and BOOTING reply):
        # the next loop client's stats carry them, never dropped (never a clean run; docs/protocol.md)
        self.pending_link = LinkStats()

    @property
    def reenumerates(self) -> bool:
        return self.reset_style == "usb_serial_jtag" or self.spec.reenumerates

    def open(self) -> serial.SerialBase:
        """The open handle (opened here, exclusively, when there is none)."""
        if self.serial is None or not self.serial.is_open:
            self.serial = open_port(self.spec, ROM_BAUD, exclusive=True)
        return self.serial

    def close(self) -> None:
        port, self.serial = self.serial, None
        if port is not None:
            port.close()

    def __enter__(self) -> DeviceSession:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reopen(self) -> serial.SerialBase:
        return reopen_after_reenumeration(self.spec, self.console_baud)

    def flash(
        self,
        artifacts: Sequence[tuple[int, Path | str]],
        *,
        progress: ProgressCallback | None = None,
        log_path: Path | None = None,
        connect_attempts: int = 7,
        diff_with: Sequence[Path | str | None] | None = None,
    ) -> FlashResult:
        """Flash the board's chip (refusing another chip or revision) and stay in the stub: :meth:`capture`
        then resets into the app itself, after switching the port to the console baud, so the first line
        is not lost."""
        port = self.open()
        self.link_baud = None  # esptool resets the chip: its app boots at the console baud again
        if self.spec.caps.installs_program:  # a native board: install the program, no esptool
            return install_program(port, artifacts, log_path=log_path)
        result = flash_artifacts(
            port,
            artifacts,
            expected_chip=getattr(self.board, "chip", None),
            chip_revisions=getattr(self.board, "chip_revisions", None),
            baud=self.flash_baud,
            reset_style=self.reset_style,
            after="no-reset-stub",
            console_baud=self.console_baud,
            progress=progress,
            log_path=log_path,
            port_spec=self.spec,
            connect_attempts=connect_attempts,
            diff_with=diff_with,
        )
        if result.serial is not None:
            self.serial = result.serial
        return result

    def capture(self, log_path: Path | None = None, *, reset: bool = True, **kwargs: Any) -> RawCapture:
        """Reset into the app (board reset style) and read until END / timeout; see
        :func:`harness.device.console.capture_run` for the keyword arguments."""
        port = self.open()
        if reset:  # a reset boots the app at the console baud, a boot of its own: repairs still pending
            self.link_baud = None  # were an earlier boot's (reported with it), never this one's
            self.pending_link = LinkStats()
        cap = capture_run(
            port,
            log_path=log_path,
            reset=self.reset_style if reset else None,
            baud=self.console_baud,
            caps=self.spec.caps,
            reopen=self._reopen if self.reenumerates else None,
            **kwargs,
        )
        if cap.serial is not None:
            self.serial = cap.serial
        return cap

    def describe(self) -> dict[str, object]:
        """What reports say about the port (transport, caps, USB identity)."""
        return {**dataclasses.asdict(self.spec), "reset_style": self.reset_style}

    # ---- the resident loop (docs/protocol.md "Resident loop") ---------------------------------------

    def boot(self, log_path: Path | None = None, *, reset: bool = True, **kwargs: Any) -> RawCapture:
        """Reset into the app (``reset``) or just listen (after a slot switch), and read until the resident
        firmware's HELLO frame (``RawCapture.hello``), a timeout, silence, a boot loop or a lost link."""
        kwargs.setdefault("max_boots", 4)
        return self.capture(log_path, reset=reset, stop_at_end=False, stop_at_hello=True, **kwargs)

    def client(self, hello: frames.Hello, log: IO[bytes] | None = None, **kwargs: Any) -> LoopClient:
        """A loop client on the open handle (``log``: a binary file every received byte goes to)."""
        client = LoopClient(self.open(), hello, log, **kwargs)
        client.stats.add(self.pending_link)
        self.pending_link = LinkStats()
        return client

    def switch_slot(
        self,
        hello: frames.Hello,
        slot: int,
        log_path: Path | None = None,
        *,
        seq: int = 0,
        stale_keys: Sequence[int] = (),
        **kwargs: Any,
    ) -> RawCapture:
        """Ask the running app to boot ``slot`` next (BOOT, command ``seq``), then read its reply and its
        reboot up to the new HELLO (``stale_keys``: earlier boots' keys, as a loop client's).

        LinkError when the app refuses (its status names the ESP-IDF error, e.g. an invalid image);
        DeviceRestarted when it booted again before its reply at the fast baud."""
        port = self.open()
        boot = (frames.CMD_BOOT, bytes([slot]))

        def send_boot() -> None:
            try:
                port.write(frames.encode_frame(boot[0], seq, boot[1], key=hello.key))
            except (serial.SerialException, OSError) as exc:
                raise LinkLost(f"the serial link was lost before the slot switch ({exc})") from exc

        if self.link_baud is not None:  # the reply comes at the fast baud, the reboot at the console baud
            with _append(log_path) as log:
                reply = self._await_frame(
                    hello, lambda f: f.type == frames.RSP_BOOT, 5.0, log, "the BOOTING reply", stale_keys,
                    command=boot, seq=seq,
                )  # fmt: skip
            if reply is not None and frames.decode_boot(reply.payload)[1] != 0:
                raise _refused_boot(slot, reply)  # the app runs on, at the fast baud
            self.link_baud = None
        else:
            send_boot()

        def stop(frame: frames.Frame) -> bool:  # the new boot's HELLO, a refusal, a NAK of the BOOT
            if frame.type == frames.RSP_NAK:
                return frames.decode_nak(frame.payload)[0] == seq
            if frame.type == frames.RSP_HELLO:  # a replay of the running boot's own HELLO is stale
                with contextlib.suppress(frames.FrameFormatError):
                    if frames.decode_hello(frame.payload).key == hello.key:
                        repairs.stale_frames += 1
                        return False
                return True
            return frame.type == frames.RSP_BOOT and frames.decode_boot(frame.payload)[1] != 0

        kwargs.setdefault("max_boots", 4)
        repairs = LinkStats()  # the new boot's first client reports them
        while True:
            cap = self.capture(
                log_path, reset=False, stop_at_end=False, stop_on_frame=stop, frame_key=hello.key,
                stale_keys=stale_keys, **kwargs,
            )  # fmt: skip
            repairs.stale_frames += cap.stale_frames
            if cap.stop_frame is None or cap.stop_frame.type != frames.RSP_NAK:
                break
            repairs.naks += 1  # the BOOT arrived damaged: sent again (docs/protocol.md, go-back-N)
            if repairs.naks > MAX_RETRANSMITS:
                raise LinkError(
                    f"the running app NAK'd the slot switch {MAX_RETRANSMITS} times",
                    hint="check the cable and the baud rate",
                )
            repairs.retransmitted_frames += 1
            send_boot()
        self.pending_link.add(repairs)
        if cap.stop_frame is not None and cap.stop_frame.type == frames.RSP_BOOT:
            raise _refused_boot(slot, cap.stop_frame)
        return cap

    def _await_frame(
        self,
        hello: frames.Hello,
        want: Callable[[frames.Frame], bool],
        timeout: float,
        log: IO[bytes] | None,
        what: str,
        stale_keys: Sequence[int] = (),
        *,
        command: tuple[int, bytes] | None = None,
        seq: int = 0,
    ) -> frames.Frame | None:
        """Send ``command`` (type, payload) as command ``seq``, if given, then read until a frame of this
        boot that ``want`` accepts arrives (None: ``timeout`` passed), through a loop client: the one
        decoder path, with each of its checks (this boot's key, earlier boots' frames dropped, damage
        counted, a NAK'd command sent again, bounded, a lost link). DeviceRestarted when the device booted
        again before that frame came (``what``: the frame, for the message)."""
        client = LoopClient(self.open(), hello, log, stale_keys=stale_keys, seq=seq)
        deadline = time.monotonic() + timeout
        try:
            if command is not None:
                client.send(*command)
            while (left := deadline - time.monotonic()) > 0:
                client.pump(min(left, 0.05))
                found = next((f for f in client.inbox if want(f)), None)
                if found is not None:
                    return found
                if client.restarted:
                    raise DeviceRestarted(f"the device restarted while esp-check waited for {what}")
            return None
        finally:  # its repairs: the next loop client's stats carry them (never a clean run)
            self.pending_link.add(client.stats.repairs())

    def set_link_baud(
        self,
        hello: frames.Hello,
        baud: int,
        *,
        seq: int,
        log_path: Path | None = None,
        stale_keys: Sequence[int] = (),
    ) -> tuple[int, int]:
        """Switch the resident loop to ``baud`` (docs/protocol.md "Fast link"): BAUD, then a SYNC round
        trip at the new baud; when that fails, back to the console baud (the device goes back by itself
        after ``BAUD_CONFIRM_S``) and a SYNC there. Returns (the baud the link runs at, next command seq).

        LinkError when no round trip works at either baud (DeviceRestarted: the device booted again;
        LinkLost: the port itself failed)."""
        with _append(log_path) as log:
            try:
                return self._switch_baud(hello, baud, seq, log, stale_keys)
            except (serial.SerialException, OSError) as exc:  # setting the port's baud rate, as a write
                raise LinkLost(f"the serial link was lost while switching to {baud} baud ({exc})") from exc

    def _switch_baud(
        self, hello: frames.Hello, baud: int, seq: int, log: IO[bytes] | None, stale_keys: Sequence[int]
    ) -> tuple[int, int]:
        port = self.open()
        reply = self._await_frame(
            hello, lambda f: f.type == frames.RSP_BAUD, 2.0, log, "the BAUD_OK reply", stale_keys,
            command=(frames.CMD_BAUD, struct.pack("<I", baud)), seq=seq,
        )  # fmt: skip
        seq += 1
        if reply is not None and frames.decode_baud(reply.payload) != (baud, 0):
            return self.console_baud, seq  # refused: the console baud it is
        # (baud, seq of the SYNC): at the new baud; back at the console baud (the device went back: it
        # never got that SYNC); at the new baud once more with the next seq (it did get the SYNC and
        # stayed: only its SYNC_ACK was lost, a repair)
        tries = [(baud, seq), (self.console_baud, seq), (baud, seq + 1)]
        if reply is None:  # lost on the way: a repair, and the device may have switched: wait it out
            self.pending_link.rx_gaps += 1
            tries = tries[1:2]
        for k, (rate, sseq) in enumerate(tries):
            if rate != baud:  # the device goes back to its console baud by itself
                time.sleep(frames.BAUD_CONFIRM_S + 0.2)
            port.baudrate = rate
            token = struct.pack("<I", random.getrandbits(32))

            def synced(frame: frames.Frame, token: bytes = token) -> bool:
                return frame.type == frames.RSP_SYNC and frame.payload[:4] == token

            sync = (frames.CMD_SYNC, token)
            ack = self._await_frame(
                hello, synced, 0.8, log, "the SYNC_ACK reply", stale_keys, command=sync, seq=sseq
            )
            if ack is not None:
                self.link_baud = rate if rate != self.console_baud else None
                self.pending_link.rx_gaps += 1 if k == 2 else 0  # its first SYNC_ACK was lost
                return rate, sseq + 1
        raise LinkError(
            f"no SYNC round trip after the switch to {baud} baud, nor back at the console's "
            f"{self.console_baud}",
            hint="check the USB-UART bridge's top rate; set link_baud in the board file to what it handles",
        )


def _refused_boot(slot: int, reply: frames.Frame) -> LinkError:
    """The app's BOOT reply refused the slot (its status names the ESP-IDF error)."""
    status = frames.decode_boot(reply.payload)[1]
    return LinkError(
        f"the running app refused to boot ota_{slot} next (status 0x{status & 0xFFFFFFFF:x})",
        hint="that slot holds no valid image: flash both variants again",
    )


@contextlib.contextmanager
def _append(path: Path | None) -> Iterator[IO[bytes] | None]:
    if path is None:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        yield f


def install_program(
    port: serial.SerialBase, artifacts: Sequence[tuple[int, Path | str]], *, log_path: Path | None = None
) -> FlashResult:
    """Flash a native board (no ROM loader, no esptool): write a native build's files to the board behind
    ``port``, each at its flash offset (a bare program at offset 0 alone is installed as it is), skipping
    regions it already holds. The result has an esptool flash's shape: reports treat both alike."""
    t0 = time.monotonic()
    if not isinstance(port, NativeSerial):
        raise FlashFailure(
            "a native build can only be installed on a native:// port", kind="usage",
            hint="use the native board's port (omit --port, or give native://NAME)",
        )  # fmt: skip
    if not artifacts:
        raise FlashFailure("nothing to flash", kind="usage", hint="build the project first")
    regions: list[RegionResult] = []
    lines: list[str] = []
    for offset, path in sorted(artifacts, key=lambda a: a[0]):
        t1 = time.monotonic()
        file = Path(path)
        try:
            bare = offset == 0 and len(artifacts) == 1
            size, sha, written = port.install(file) if bare else port.write_region(offset, file)
        except OSError as exc:
            raise FlashFailure(
                f"cannot write {file} at 0x{offset:x} on native board {port.name}: {exc.strerror or exc}",
                kind="usage", hint="rebuild the project",
            ) from exc  # fmt: skip
        what = "the board already holds it: skipped" if written == 0 else "written"
        lines.append(f"native: installed {file.name} at 0x{offset:x} ({size} B, sha256 {sha[:16]}; {what})\n")
        md5 = hashlib.md5(file.read_bytes(), usedforsecurity=False).hexdigest()
        region = RegionResult(offset, file, size, md5, skipped=written == 0, bytes_written=written)
        region.seconds, region.verified = time.monotonic() - t1, True
        regions.append(region)
    text = "".join(lines) + f"native: native://{port.name} flashed\n"
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(text, encoding="utf-8")
    return FlashResult(
        port=f"native://{port.name}",
        chip="native",
        chip_name="host program",
        description="native board: the firmware built for this PC, run as a program",
        baud=0,
        before="none",
        after="none",
        regions=regions,
        duration_s=time.monotonic() - t0,
        log_path=log_path,
        esptool_log=text,
        serial=port,
    )
