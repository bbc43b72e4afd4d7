"""Resident firmware on one board: flash both variants once, boot the slot each run needs, stream the
inputs (docs/protocol.md "Resident loop", docs/firmware.md "Flash layout").

Why one esptool session writes only what differs and the running app switches slots itself: docs/firmware.md
"Flash layout". Only when no app is running to ask (a variant that never reaches HELLO) does the host
select the slot with esptool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import serial

from harness.device.console import RawCapture
from harness.device.flash import FlashResult, RegionResult
from harness.device.loop import DeviceRestarted, LinkError, LinkLost, LinkStats, LoopClient
from harness.device.session import DeviceSession
from harness.errors import EspCheckError
from harness.firmware.build import RUN_ROLES, BuildResult
from harness.flashfmt import otadata
from harness.flashfmt.model_image import ModelImageError, parse_model_image
from harness.flashfmt.partitions import OTA_APPS, VARIANT_SLOTS
from harness.flows.records import FlashFacts, FlashRegion, Recorder, StageTimeouts
from harness.manifest import VARIANT_OF_NN
from harness.protocol import frames
from harness.protocol.app_image import APP_DESC_AT, APP_DESC_ELF_SHA, elf_sha256, slot_sha256

FLASH_SKIPPED = "flash skipped: the board already holds these images (HELLO hashes)"
# The HELLO probe before flashing: a resident app prints HELLO within a boot; a blank board, or one
# running something else, costs at most this much before esptool runs as before.
PROBE_SILENCE_S = 3.0
PROBE_TOTAL_S = 10.0
_LOADED_APP_RE = re.compile(rb"Loaded app from partition at offset 0x([0-9a-fA-F]+)")
# ESP-IDF's start-up log: "app_init: ELF file SHA256:  a41b7d498..." (CONFIG_APP_RETRIEVE_LEN_ELF_SHA
# characters, 9 by default), read from the running image's app description
_ELF_SHA_RE = re.compile(rb"ELF file SHA256:\s+([0-9a-fA-F]{8,64})")


@dataclasses.dataclass
class Boot:
    """One boot into the app: what it printed, its HELLO, and which variant it is (None: unknown)."""

    raw: RawCapture
    hello: frames.Hello | None
    variant: str | None
    next_seq: int = 0  # the next command frame's sequence number on this boot
    link_baud: int = 0  # the resident loop's baud after the switch (0: not tried yet)


def merged_flash_files(builds: Mapping[str, BuildResult]) -> list[tuple[int, Path]]:
    """One esptool write for both variants: bootloader, table and model once, each app in its slot."""
    first = next(iter(builds.values()))
    files = first.flash_files([r for r in RUN_ROLES if r != "app"])
    for b in builds.values():
        files += b.flash_files(["app"])
    return sorted(files)


def app_slot_sha256(build: BuildResult) -> str:
    """What the device's HELLO reports for a slot holding ``build``'s app ("" unknown: no app file);
    the build's stored figure when it has one (no image parse, no esptool import on a repeat run)."""
    if build.app_slot_sha256:
        return build.app_slot_sha256
    art = build.artifact("app")
    if art is None or not art.path.is_file():
        return ""
    return slot_sha256(art.path.read_bytes(), build.chip)


def images_differ(hello: frames.Hello | None, builds: Mapping[str, BuildResult], model_sha: str) -> list[str]:
    """Why the board does not hold exactly these builds, from what its app itself reported in HELLO (the
    model's, the running slot's and the other slot's SHA-256); an empty list: it holds them all and
    flashing would write nothing. Anything missing or unknown is a reason: a false "holds them" would
    check firmware that is not the build."""
    if hello is None:
        return ["no HELLO from an esp-check app"]
    why = []
    if hello.init_status != 0:
        why.append(f"the app stopped at start-up ({hello.init_stage})")
    if not model_sha or hello.model_sha256 != model_sha:
        why.append("the model partition holds another model")
    running = VARIANT_OF_NN.get(hello.nn)
    if hello.slot not in range(OTA_APPS) or (
        running in VARIANT_SLOTS and VARIANT_SLOTS[running] != hello.slot
    ):
        why.append(f"the {hello.nn} app runs from slot {hello.slot}, not its own")
    for v, b in sorted(builds.items()):
        slot = VARIANT_SLOTS.get(v)
        reported = hello.app_sha256 if slot == hello.slot else hello.other_sha256
        want = app_slot_sha256(b)
        if slot is None or not want or reported != want:
            what = "is not reported" if not reported else "differs"
            why.append(f"the SHA-256 of the {v} app in ota_{slot} {what}")
    return why


def app_elf_sha256(build: BuildResult) -> str:
    """The ELF SHA-256 in the app description of ``build``'s image: what its start-up log prints a prefix
    of ("ELF file SHA256:"); "" when the image has none (not an ESP-IDF app image, or no hash set)."""
    art = build.artifact("app")
    if art is None or not art.path.is_file():
        return ""
    with open(art.path, "rb") as f:
        return elf_sha256(f.read(APP_DESC_AT + APP_DESC_ELF_SHA + 32))


class OtherApp:
    """A probe boot's line check: True once the app the bootloader loaded prints, in its start-up log, an
    ELF SHA-256 that is not the one of the build meant for that slot. That slot must be flashed whatever
    else the boot prints, so the probe need not wait for a HELLO (nor for an app that never gives one:
    one that runs compiled-in inputs into a hang, a blank slot's silence). ``why`` says what was seen."""

    def __init__(self, builds: Mapping[str, BuildResult]) -> None:
        self.elf: dict[int, tuple[str, str]] = {}  # app offset -> the ELF SHA-256 its build's image holds
        for v, b in builds.items():
            art, sha = b.artifact("app"), app_elf_sha256(b)
            if art is not None and sha:
                self.elf[art.offset] = (v, sha)
        self.offset: int | None = None  # the slot the last "Loaded app" line names
        self.why = ""

    def __call__(self, line: bytes) -> bool:
        if (m := _LOADED_APP_RE.search(line)) is not None:
            self.offset = int(m.group(1), 16)
            return False
        if (m := _ELF_SHA_RE.search(line)) is None or self.offset not in self.elf:
            return False
        variant, want = self.elf[self.offset]
        printed = m.group(1).decode().lower()
        if want.startswith(printed):
            return False
        self.why = (
            f"the app at 0x{self.offset:x} prints ELF SHA-256 {printed}..., not the {variant} build's "
            f"{want[: len(printed)]}..."
        )
        return True


def flash_facts(flashed: FlashResult, builds: Mapping[str, BuildResult]) -> FlashFacts:
    owner = {
        a.offset: (a.role, v if a.role == "app" else None) for v, b in builds.items() for a in b.artifacts
    }
    facts = FlashFacts(
        chip=flashed.chip,
        revision=flashed.revision,
        mac=flashed.mac,
        regions=[
            FlashRegion(
                offset=r.offset,
                role=owner.get(r.offset, ("?", None))[0],
                variant=owner.get(r.offset, ("?", None))[1],
                size=r.size,
                skipped=r.skipped,
                bytes_written=r.bytes_written,
            )
            for r in flashed.regions
        ],
        bytes_written=flashed.bytes_written,
        seconds=round(flashed.duration_s, 3),
    )
    if flashed.skipped_reason:
        facts["skipped"] = flashed.skipped_reason
    return facts


class ResidentBoard:
    """A board with resident esp-check firmware, over one open :class:`DeviceSession`."""

    def __init__(
        self,
        rec: Recorder,
        dev: DeviceSession,
        builds: Mapping[str, BuildResult],
        limits: StageTimeouts,
        simulated: bool | None = None,
    ) -> None:
        self.rec, self.dev, self.builds, self.limits = rec, dev, dict(builds), limits
        self.simulated = simulated  # what the board definition says (None: unknown)
        self.current: Boot | None = None  # the app now running (None: not booted since we came)
        self.link = LinkStats()
        self.lost = False  # the link dropped: reopen the port before the next boot
        self.last_link = LinkStats()  # the last session's
        self.keys: list[int] = []  # the boot keys of every boot seen (docs/protocol.md "Boot key")
        self.probe_notes: list[str] = []  # why the last probe did not skip the flash
        self._probe_raw: RawCapture | None = None  # the probe's boot, until a variant's log takes it
        # the last boot when it left no app ready (a crash, a loop, silence): the next ensure() of the same
        # variant reads this start-up evidence instead of booting the app into the same failure again
        self._failed_start: Boot | None = None

    @functools.cached_property
    def model_sha256(self) -> str:
        """SHA-256 of the model esp-check flashed (from the model partition image it wrote), or ""."""
        for b in self.builds.values():
            art = b.artifact("model")
            if art is not None and art.path.is_file():
                with contextlib.suppress(ModelImageError, OSError):
                    return parse_model_image(art.path.read_bytes()).sha256
                break
        return ""

    def other_firmware(self, boot: Boot, variant: str) -> str:
        """Why the running app is not ``variant``'s build, from its HELLO's image SHA-256 ("": it is, or
        the firmware does not report it)."""
        got = boot.hello.app_sha256 if boot.hello is not None else ""
        build = self.builds.get(variant)
        want = "" if build is None else app_slot_sha256(build)  # the build's stored figure, as a rule
        if not got or not want or got == want:
            return ""
        return (
            f"the {variant} app reports image SHA-256 {got[:16]}... in its HELLO, but the {variant} app "
            f"esp-check built is {want[:16]}...: its results would be of another firmware"
        )

    @property
    def uart_link(self) -> bool:
        """The resident loop runs over a UART with a baud (not USB-Serial-JTAG, not a program on this PC)."""
        dev = self.dev
        uart = str(getattr(dev.board, "console", "uart")) == "uart" and not dev.reenumerates
        return uart and not dev.spec.caps.installs_program

    def stale_keys(self, hello: frames.Hello) -> list[int]:
        """Earlier boots' keys: their frames are dropped and counted, never used."""
        return [k for k in self.keys if k != hello.key]

    def client(self, boot: Boot, log: IO[bytes]) -> LoopClient:
        """A loop client on ``boot``'s app (every byte received goes to ``log``), earlier boots' frames
        dropped."""
        assert boot.hello is not None
        keys = self.stale_keys(boot.hello)
        stall = self.limits.capture_silence
        return self.dev.client(boot.hello, log, stall_timeout=stall, seq=boot.next_seq, stale_keys=keys)

    def _timeouts(self) -> dict[str, float]:
        return {"total_timeout": self.limits.capture_total, "silence_timeout": self.limits.capture_silence}

    def flash(self, log_path: Path) -> FlashResult:
        """Write both variants, the table and the model (what flash already holds is skipped); no esptool
        session at all when the running app's HELLO shows the board holds every image (:meth:`probe`)."""

        def go() -> FlashResult:
            held = self.probe(log_path.with_name("boot-probe.log"))
            if held is not None:
                return held
            self.current, self._failed_start = None, None
            return self.dev.flash(merged_flash_files(self.builds), log_path=log_path)

        def why() -> str:  # the probe's reasons to flash (nothing: the flash was skipped, or not probed)
            return "flashed: " + "; ".join(self.probe_notes) if self.probe_notes else ""

        return self.rec.run("flash", None, go, detail=why)

    def probe(self, log_path: Path) -> FlashResult | None:
        """Boot the board's app and read its HELLO: when the model and both app slots are the builds'
        (:func:`images_differ`), that boot stays current and a FlashResult that wrote nothing is returned;
        else None (flash as before; why is in ``self.probe_notes``)."""
        t0 = time.monotonic()
        self.probe_notes = []
        other = OtherApp(self.builds)  # a slot that prints another build's ELF SHA-256: flash, stop here
        try:
            boot = self._booted(
                self.dev.boot(
                    log_path,
                    reset=True,
                    total_timeout=min(PROBE_TOTAL_S, self.limits.capture_total),
                    silence_timeout=min(PROBE_SILENCE_S, self.limits.capture_silence),
                    # a second boot start before a HELLO: this boot never reached the resident app
                    # (blank flash, another firmware, a crash at start-up), so flash it
                    max_boots=2,
                    stop_on_line=other,
                    stale_keys=self.keys,  # a reset: every boot seen so far is an earlier one
                )
            )
        except (EspCheckError, serial.SerialException, OSError) as exc:
            self.current, self.probe_notes = None, [f"no HELLO: {exc}"]
            return None
        self.probe_notes = images_differ(boot.hello, self.builds, self.model_sha256)
        if other.why:
            self.probe_notes = [other.why]
        elif boot.hello is None:
            self.probe_notes.append(
                f"the probe read {boot.raw.boots} boot starts and ended by {boot.raw.ended_by}"
            )
        if self.probe_notes or self.current is None or boot.raw.ended_by == "disconnect":
            self.current = None
            return None
        self._probe_raw = boot.raw
        regions = []
        for off, path in merged_flash_files(self.builds):
            data = path.read_bytes()
            md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
            regions.append(RegionResult(off, path, len(data), md5, skipped=True))
        return FlashResult(
            self.dev.spec.url,
            "",
            "",
            baud=self.dev.console_baud,
            before="",
            after="",
            regions=regions,
            duration_s=time.monotonic() - t0,
            log_path=None,
            skipped_reason=FLASH_SKIPPED,
        )

    def _variant_of(self, raw: RawCapture, hello: frames.Hello | None) -> str | None:
        if hello is not None:
            return VARIANT_OF_NN.get(hello.nn)
        found = _LOADED_APP_RE.findall(raw.data)  # the last boot's line counts
        if not found:
            return None
        offset = int(found[-1], 16)
        return next(
            (v for v, b in self.builds.items() if (a := b.artifact("app")) and a.offset == offset), None
        )

    def _booted(self, raw: RawCapture) -> Boot:
        hello = None
        if raw.hello is not None:
            try:
                hello = frames.decode_hello(raw.hello)
            except frames.FrameFormatError:
                hello = None
        boot = Boot(raw, hello, self._variant_of(raw, hello))
        self.current = boot if hello is not None and hello.init_status == 0 else None
        if hello is not None and hello.key not in self.keys:
            self.keys.append(hello.key)
        return boot

    def ensure(self, variant: str, log_path: Path) -> Boot:
        """Boot the app of ``variant`` (a reset the first time, then the running app's own slot switch)."""

        def go() -> Boot:
            cur = self.current
            if self.lost:  # as a fresh session would: close the dead handle, open the port again
                with contextlib.suppress(Exception):
                    self.dev.close()
                self.dev.open()
                self.lost = False
            if cur is None:
                # a reset: every boot seen so far is an earlier one (a replay of its HELLO is stale)
                cur = self._booted(
                    self.dev.boot(log_path, reset=True, stale_keys=self.keys, **self._timeouts())
                )
                if cur.variant == variant or self.current is None or variant not in VARIANT_SLOTS:
                    return cur  # the wanted app, or a start-up failure (its evidence), or no slots
            assert cur.hello is not None
            slot, stale = VARIANT_SLOTS[variant], self.stale_keys(cur.hello)
            seq, cur.next_seq = cur.next_seq, (cur.next_seq + 1) & 0xFFFF  # an app that refuses runs on
            switched = self.dev.switch_slot(
                cur.hello, slot, log_path, seq=seq, stale_keys=stale, **self._timeouts()
            )
            return self._booted(switched)

        def guarded() -> Boot:
            try:
                boot = go()
            except (serial.SerialException, OSError) as exc:
                self.lost, self.current = True, None
                raise LinkLost(f"the serial link was lost while booting the {variant} app ({exc})") from exc
            except DeviceRestarted:  # before its slot switch's reply: the running boot is gone
                self.current = None
                raise
            self.lost = boot.raw.ended_by == "disconnect"
            return boot

        if self.current is not None and self.current.variant == variant:
            self._adopt_probe(log_path)
            self._fast_link(self.current, variant, log_path)
            return self.current  # already running: no boot, and no second "boot" stage in the report
        failed, self._failed_start = self._failed_start, None
        if failed is not None and failed.variant == variant and self.current is None and not self.lost:
            return failed  # this variant's start-up just failed: that boot is its evidence, read once
        self._probe_raw = None  # another variant's boot: its start-up stays in boot-probe.log
        boot = self.rec.run("boot", variant, guarded)
        if boot is not self.current:
            self._failed_start = boot
        if boot is self.current and boot.variant == variant:
            self._fast_link(boot, variant, log_path)
        return boot

    def _fast_link(self, boot: Boot, variant: str, log_path: Path) -> None:
        """Right after HELLO: the resident loop at the board's ``link_baud`` (docs/protocol.md "Fast
        link"), verified by a round trip, else at the console baud; a stage ``link-baud`` says which.
        USB-Serial-JTAG and native boards run at their own speed."""
        dev = self.dev
        want = int(getattr(dev.board, "link_baud", 0) or 0)
        if boot.link_baud or boot.hello is None or not self.uart_link or want <= dev.console_baud:
            return
        t0 = time.monotonic()
        try:
            rate, boot.next_seq = dev.set_link_baud(
                boot.hello, want, seq=boot.next_seq, log_path=log_path, stale_keys=self.stale_keys(boot.hello)
            )
        except LinkError as exc:
            self.current, self.lost = None, isinstance(exc, LinkLost)  # lost: reopen before the next boot
            self.rec.add("link-baud", variant, exc.exit_code, time.monotonic() - t0, str(exc))
            raise
        boot.link_baud = rate
        detail = f"{rate} baud (console {dev.console_baud}, asked {want})"
        self.rec.add("link-baud", variant, None, time.monotonic() - t0, detail)

    def _adopt_probe(self, log_path: Path) -> None:
        """The probe's boot became this variant's: its start-up log opens the variant's serial log."""
        raw, self._probe_raw = self._probe_raw, None
        if raw is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as f:
                f.write(raw.data)

    def select_with_esptool(self, variant: str, log_path: Path) -> None:
        """No app runs to ask for a slot switch: write otadata selecting ``variant``'s slot (esptool)."""
        b = self.builds[variant]
        ota = b.artifact("otadata")
        if ota is None or variant not in VARIANT_SLOTS:
            return
        data = otadata.select(b"\xff" * ota.path.stat().st_size, VARIANT_SLOTS[variant], OTA_APPS)
        path = ota.path.parent / f"select-{variant}.bin"
        path.write_bytes(data)
        self.rec.run("select-slot", variant, lambda: self.dev.flash([(ota.offset, path)], log_path=log_path))
        self.current, self._failed_start = None, None

    def text_session(self, boot: Boot, inputs: Sequence[bytes], log_path: Path) -> RawCapture:
        """Stream ``inputs`` in a text session; the device's text capture (with the boot before it in the
        log) is what the protocol parser then checks."""
        t0 = time.monotonic()
        ended_by = "end_record"
        notes: list[str] = []
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            client = self.client(boot, log)
            try:
                client.text_session(list(inputs))
            except DeviceRestarted as exc:
                ended_by, self.current = "restart", None
                notes.append(str(exc))
            except LinkError as exc:
                ended_by, self.current = ("disconnect" if isinstance(exc, LinkLost) else "silence"), None
                notes.append(str(exc))
            except EspCheckError as exc:  # a lost port: the capture is what arrived
                ended_by, self.current = "disconnect", None
                notes.append(str(exc))
        self.lost = ended_by == "disconnect"
        boot.next_seq = client.seq
        self.last_link = client.stats
        self.link.add(client.stats)
        if not client.stats.clean:
            notes.append(f"link repairs: {client.stats.to_dict()}")
        return RawCapture(bytes(client.raw), log_path, ended_by, time.monotonic() - t0, notes=notes)
