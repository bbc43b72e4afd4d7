"""The simulated esp-check app after the bootloader handed over: start-up log, the model mapped from its
partition, the inputs compiled into the image (text records), then the resident command loop.

The loop is the firmware's own ``esp_check_loop.c`` through ctypes (or its byte-identical Python twin,
:func:`harness.protocol.native.make_loop`); this module supplies what app_main.cc supplies on a chip: the
model run (the host TFLM reference, in process, one interpreter per model), identity records, the app
slot switch (it writes otadata as ``esp_ota_set_boot_partition`` does), and the injected faults. Its
output is :class:`Piece` lists, timed in device time (start-up log timestamps, modelled invokes).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.errors import HostReferenceError, ModelError, ReferenceRefusedError
from harness.flashfmt import otadata
from harness.flashfmt.partitions import APP, DATA, OTA_0, OTADATA, Partition, find
from harness.model.backends import get_backend, host_arena_bytes
from harness.model.hostrun import InvokeChild
from harness.model.hybrid_ops import ANSI_KINDS, ansi_path_applies
from harness.model.loader import parse_model_bytes
from harness.model.reference import run_reference
from harness.protocol import frames, loop
from harness.protocol.app_image import APP_NAME
from harness.protocol.emitter import TapTensor, emit_tensor
from harness.protocol.loop import ECL_HALTED, ECL_REBOOT, LoopConfig, LoopOutput
from harness.protocol.native import make_loop
from harness.protocol.spec import DTYPES, MARKER, TAP_RECORD_BYTES, crc32
from harness.sim.chips import ChipSpec
from harness.sim.crash import ELF_SHA_PRINTED, panic_text
from harness.sim.cycles import Dispatch, invoke_us, op_cycles
from harness.sim.faults import KEEP_FAULTS, OP_FAULTS, FaultSpec, bump_lsb, flip_bits
from harness.sim.image import AppPayload, ImageError, load_image
from harness.sim.tap_sim import OpFault, region_mask, simulate_ops

SIM_BANNER = "esp-check SIMULATED BOARD"
# reference outputs kept per board, above the largest dataset (2 x 100,000 inputs): both variants run the
# same inputs; the board's cache container (board.ReferenceCache) bounds their bytes
_CACHE_LIMIT = 1 << 18
# TFLM's TfLiteType codes 1 .. 19 (tflite_types.h: kTfLiteFloat32 = 1 .. kTfLiteBFloat16), by dtype name
_TFLITE_TYPES = (
    "float32 int32 uint8 int64 string bool int16 complex64 int8 float16 float64 complex128 uint64 resource "
    "variant uint32 uint16 int4 bfloat16"
)


@dataclass(frozen=True)
class Piece:
    """One stretch of output: ``kind`` "rom" (115200 baud), "console" (app baud) or "disconnect";
    ``at``: seconds of device time from the start of the call that produced it (for a boot: from the
    reset's release) to its first byte on the wire."""

    kind: str
    data: bytes = b""
    at: float = 0.0


class Clock:
    """ESP-IDF log timestamps (ms since boot), deterministic."""

    def __init__(self, start: int = 27) -> None:
        self.ms = start

    @property
    def seconds(self) -> float:
        """Now, on the boot's clock: when the next piece starts."""
        return self.ms / 1000.0

    def line(self, level: str, tag: str, msg: str, step: int = 3) -> bytes:
        self.ms += step
        return f"{level} ({self.ms}) {tag}: {msg}\r\n".encode()


@dataclass
class AppEnv:
    """What one boot of the app needs from the board."""

    chip: ChipSpec
    flash: bytearray  # the app writes otadata into it (BOOT command)
    parts: list[Partition]  # the partition table the bootloader read (filled at boot)
    faults: FaultSpec
    boot_index: int
    emitter_backend: str
    cache: dict[str, Any]
    invoke_time: str = "0"  # "model": busy for the modelled invoke time; else seconds (float)
    log: Callable[[str], None] = lambda _m: None
    keep: bytearray | None = None  # PSRAM a software restart leaves alone (the kept-input store's memory)


@dataclass
class _Init:
    info: Any = None
    stage: int = 0  # 0 ok, else an ERROR stage code (harness.protocol.frames.STAGES)
    code: int = 0
    msg: str = ""
    arena_used: int = 0
    tflm: str = "sim"
    dispatch: Any = None  # harness.sim.cycles.Dispatch: which kernel each op runs
    fallback_ops: int = 0  # hybrid table nodes ESP-NN does not handle (the original kernel runs them)
    op_fault: Any = None  # harness.sim.tap_sim.OpFault that fires in this image (None: none)
    cycles: list[int] = field(default_factory=list)  # modelled cycles per op


# faults of the line / ROM / the board's memory, not of the app image
LINE_FAULTS = ("sync_fail", "baud_fail", *KEEP_FAULTS)


class SimApp:
    """One boot of the simulated app (construct, then :meth:`start`; then :meth:`rx` / :meth:`idle`)."""

    def __init__(
        self,
        env: AppEnv,
        payload: AppPayload,
        model_error: str | None,
        elf_sha: str,
        clock: Clock,
        slot: int | None,
        slot_shas: tuple[str, str] = ("", ""),
    ) -> None:
        self.env, self.payload, self.elf_sha, self.clock, self.slot = env, payload, elf_sha, clock, slot
        self.slot_shas = slot_shas  # esp_partition_get_sha256 of the running slot and the other one
        self.model_sha = hashlib.sha256(payload.model).hexdigest() if payload.model else ""  # HELLO's, INFO's
        self.baud_request: int | None = None  # BAUD accepted: the board switches the UART after the reply
        faults = env.faults
        self.active = sorted(
            f for f in faults.names if faults.active(f, payload.variant) and f not in LINE_FAULTS
        )
        self.init = self._initialize(model_error)
        if self.init.info is not None:
            self._dispatch(self.init)
        self._segments: list[tuple[float, bytearray]] = []
        self._busy = 0.0
        self._since_tick = 0.0  # busy seconds since the firmware last gave the idle task a tick
        self.crash: str | None = None  # panic, abort, brownout: crash text and a reboot follow
        self.last_busy = 0.0
        self.halted = False
        self.reboot: str | None = None
        self.runs = 0
        self.frames_in = 0
        self.frames_out = 0
        self._flip_at: int | None = None
        self._line_fault_done = False
        self._last_ops: list[Any] | None = None
        self.loop = self._make_loop()

    # ---- start-up ---------------------------------------------------------------------------------

    def _initialize(self, model_error: str | None) -> _Init:
        init = _Init()
        if model_error is not None:
            init.stage, init.msg = frames.STAGE_CODES["model"], model_error
            return init
        try:
            init.info = parse_model_bytes(self.payload.model)
        except Exception:
            init.stage, init.code = frames.STAGE_CODES["schema"], -1
            init.msg = "model_schema_version_differs_from_TFLITE_SCHEMA_VERSION"
            return init
        header = self.payload.header
        arena, mem = int(header.get("arena_bytes") or 0), str(header.get("arena_mem") or "internal")
        limit = int((header.get("arena_max") or {}).get(mem, arena))  # the board's, compiled into the app
        if arena > limit:  # the model partition asks for more than the app allows: refused before allocating
            init.stage, init.code = frames.STAGE_CODES["alloc"], arena
            init.msg = f"arena_{arena}_bytes_above_the_boards_{limit}_{mem}"
        elif "alloc" in self.active or not self._cpu(init.info).allocates():  # code 1: kTfLiteError
            init.stage, init.code, init.msg = frames.STAGE_CODES["alloc"], 1, "AllocateTensors_failed"
        elif len(init.info.inputs) != 1:
            init.stage, init.code = frames.STAGE_CODES["input"], len(init.info.inputs)
            init.msg = "expected_one_input_tensor"
        elif any(len(raw) != init.info.inputs[0].nbytes for raw in self.payload.inputs):
            init.stage, init.code = frames.STAGE_CODES["input"], init.info.inputs[0].nbytes
            init.msg = "input_tensor_size_differs_from_embedded_input"
        elif bad := [t.dtype for t in init.info.outputs if t.dtype not in DTYPES]:  # Setup's output check
            init.stage, init.code = frames.STAGE_CODES["output"], _TFLITE_TYPES.split().index(bad[0]) + 1
            init.msg = "unsupported_output_tensor"
        else:
            with contextlib.suppress(Exception):
                init.tflm = get_backend("tflm").version().replace(" ", "_")
            with contextlib.suppress(Exception):  # an estimate only; never fail the boot over it
                init.arena_used = int(host_arena_bytes(init.info))
        return init

    def _dispatch(self, init: _Init) -> None:
        """Which kernel each op runs (the image's variant, the hybrid wrapper's table matched to nodes by
        their first output tensor as the C wrapper does, an ``unoptimized_kind`` fault), the op fault
        that fires in this image, and the modelled cycles per op."""
        info, faults = init.info, self.env.faults
        by_out = {o.outputs[0]: o for o in info.main_ops if o.outputs and o.outputs[0] >= 0}
        ansi: set[int] = set()
        for _op, out_t, kind in self.payload.header.get("hybrid") or []:
            op = by_out.get(int(out_t))
            if op is None or ANSI_KINDS.get(op.opcode) != kind:
                continue  # the C wrapper never recognises this row
            if ansi_path_applies(info, op):
                ansi.add(op.index)
            else:
                init.fallback_ops += 1
        unopt = faults.fault_kind if "unoptimized_kind" in self.active else None
        init.dispatch = Dispatch(self.payload.variant, frozenset(ansi), unopt)
        init.op_fault = _op_fault(faults, init.dispatch, info)
        kept = [f for f in self.active if f not in OP_FAULTS]
        self.active = sorted(kept + ([init.op_fault.kind] if init.op_fault else []))
        init.cycles = op_cycles(info, self.env.chip.name, init.dispatch, salt=self.payload.variant)

    def _outputs(self) -> list[LoopOutput]:
        info = self.init.info
        if info is None or self.init.stage:
            return []
        return [
            LoopOutput(t.nbytes, t.dtype, tuple(t.shape),
                       float(t.scale or 0.0), int(t.zero_point or 0), t.name)
            for t in info.outputs
        ]  # fmt: skip

    def _make_loop(self) -> Any:
        info = self.init.info
        tin = info.inputs[0] if info is not None and info.inputs and not self.init.stage else None
        cfg = LoopConfig(
            input_bytes=0 if tin is None else tin.nbytes,
            input_dtype="unknown" if tin is None else tin.dtype,
            outputs=self._outputs(),
            window=int(self.payload.header.get("window", 16384)),
            human_max=int(self.payload.header.get("human_max", 16)),
            sim=True,
            tap=bool(self.payload.header.get("tap")),
            nn=self.payload.nn,
            slot=self.slot,
            init_status=self.init.stage,
            model_sha256=self.model_sha,
            fwver=str(self.payload.header.get("fwver", "0.0.0")),
            # a new one at every boot, as the firmware draws with esp_random() (never 0); seeded by the
            # board's seed, the boot and the image, so a simulated run replays byte for byte
            session=self.env.faults.rng(f"session:{self.elf_sha}", self.env.boot_index).getrandbits(32) | 1,
            app_sha256=self.slot_shas[0],
            other_sha256=self.slot_shas[1],
            baud_switch=str(self.payload.header.get("console", "uart")) == "uart",
        )
        # the store lives in PSRAM (EXT_RAM_NOINIT_ATTR), at its start: only an image built for a board with
        # PSRAM has one (its size compiled in, as kKeepBytes)
        size = int(self.payload.header.get("keep_bytes", 0))
        if 0 < size <= len(self.env.keep or b""):
            assert self.env.keep is not None
            cfg.keep = memoryview(self.env.keep)[:size]
            cfg.keep_place = KEEP_PLACE
        return make_loop(cfg, self, backend=self.env.emitter_backend)

    def start(self, header_flash: int) -> tuple[list[Piece], str | None]:
        """Start-up log, the boot text (compiled-in inputs or a start-up failure), HELLO. ``header_flash``:
        the flash size the bootloader's image header states (the start-up checks the chip against it)."""
        t0 = self.clock.seconds
        head, crash = self._startup(header_flash)
        if crash is not None:  # the start-up asserts (flash size, bootloop): every boot
            return [Piece("console", b"".join(head) + crash)], "sw"
        self._write(b"".join(head))
        self._busy = self.clock.seconds - t0  # app_main's output follows the start-up log
        self._boot_text()
        if self.crash is None and not self.halted:
            self.loop.hello()
        return self._collect()

    def _startup(self, header_flash: int) -> tuple[list[bytes], bytes | None]:
        """ESP-IDF's start-up log up to app_main, or up to the assert that stops it (the crash text)."""
        chip, clock, variant = self.env.chip, self.clock, self.payload.variant
        cores = "Multicore" if chip.cores > 1 else "Single core"
        head = [
            clock.line("I", "cpu_start", f"{cores} app", 40),
            clock.line("I", "cpu_start", "Pro cpu start user code"),
            clock.line("I", "cpu_start", f"cpu freq: {chip.cpu_mhz * 1000000} Hz"),
            clock.line("I", "app_init", "Application information:"),
            clock.line("I", "app_init", f"Project name:     {APP_NAME}", 1),
            clock.line("I", "app_init", f"App version:      {self.payload.header.get('fwver', '0.0.0')}", 1),
            clock.line("I", "app_init", f"ELF file SHA256:  {self.elf_sha[:ELF_SHA_PRINTED]}...", 1),
            clock.line("I", "app_init", f"ESP-IDF:          {self.payload.header.get('idf', 'sim')}", 1),
            clock.line("I", "efuse_init", f"Chip rev:         v{chip.rev}", 1),
            clock.line("I", "heap_init", "Initializing. RAM available for dynamic allocation:", 2),
        ]
        detected = len(self.env.flash)  # the flash chip's real size (its RDID answer)
        if detected < header_flash:  # esp_flash_init_default_chip refuses the chip: the core init asserts
            head.append(clock.line("E", "spi_flash", _flash_size_text(detected, header_flash, "smaller"), 10))
            return head, b"\r\n" + panic_text(chip, "flash_size", elf_sha=self.elf_sha, variant=variant)
        if detected > header_flash:
            head.append(clock.line("W", "spi_flash", _flash_size_text(detected, header_flash, "larger"), 10))
        head.append(clock.line("I", "spi_flash", "detected chip: generic", 10))
        if "bootloop" in self.active:  # no RAM left for the main task's stack: an assert before app_main
            return head, panic_text(chip, "startup", elf_sha=self.elf_sha, variant=variant)
        head += [
            clock.line("I", "main_task", "Started on CPU0", 20),
            clock.line("I", "main_task", "Calling app_main()", 10),
            clock.line("W", "esp-check", f"{SIM_BANNER} (harness.sim {chip.name}): results are simulated"),
        ]
        return head, None

    def _boot_text(self) -> None:
        inputs = self.payload.inputs
        if not inputs and not self.init.stage:
            return
        em = self.loop.emitter
        self.session_begin(em, len(inputs), arena=not self.init.stage)
        if self.init.stage:
            stage = frames.STAGES.get(self.init.stage, "internal")
            em.error(stage, self.init.code, self.init.msg, None)
            em.end(False)
            return
        for i, raw in enumerate(inputs):
            em.input(i, len(raw), self.sha256_hex(raw))
            rc, us, outs = self.invoke(raw)
            if rc:  # < 0: the device stopped (its crash text follows); > 0: app_main.cc's record of it
                if rc > 0:
                    em.error("invoke", rc, "Invoke_failed", i)
                    em.end(False)
                return
            em.time(i, us)
            for o, (t, data) in enumerate(zip(self._outputs(), outs, strict=True)):
                if not emit_tensor(em, i, o, t, data, self.loop.cfg.human_max):  # its ERROR record printed
                    em.end(False)
                    return
            self.text_extra(em, i)
        em.end(True)

    # ---- the loop's host callbacks (what app_main.cc does on a chip) --------------------------------

    def write(self, data: bytes) -> None:
        data = bytes(data)
        line = data.startswith(b"\r\n" + frames.HELLO_LINE)  # the HELLO frame, as its text line
        if "frame_tx" in self.active and (data[:2] == frames.MAGIC or line):
            self.frames_out += 1
            if self.frames_out % self.env.faults.frame_every == 0:
                damaged = bytearray(data)
                if line:  # another base64 letter: the line still decodes, the frame's CRC fails
                    at = 2 + len(frames.HELLO_LINE) + 16
                    damaged[at] = ord("B") if damaged[at] == ord("A") else ord("A")
                else:  # a flipped bit in payload or CRC
                    damaged[min(len(damaged) - 1, frames.HEADER + 1)] ^= 0x40
                data = bytes(damaged)
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._segments and self._segments[-1][0] == self._busy:
            self._segments[-1][1].extend(data)
        else:
            self._segments.append((self._busy, bytearray(data)))

    def session_begin(self, em: Any, inputs: int, arena: bool = True) -> None:
        chip, p = self.env.chip, self.payload
        em.begin(str(p.header.get("fwver", "0.0.0")), True)
        em.info([("nn", p.nn), ("target", chip.name), ("chip", chip.name), ("rev", chip.rev),
                 ("cores", chip.cores), ("cpu_mhz", chip.cpu_mhz)])  # fmt: skip
        n_out = len(self.init.info.outputs) if self.init.info is not None else 0
        em.info([("idf", str(p.header.get("idf", "sim"))), ("tflm", self.init.tflm),
                 ("espnn", str(p.header.get("espnn", "sim"))), ("model_bytes", len(p.model)),
                 ("inputs", inputs), ("outputs", n_out)])  # fmt: skip
        em.info([("model_sha256", self.model_sha or "-"), ("slot", -1 if self.slot is None else self.slot)])
        if self.active:
            em.info([("sim_fault", "+".join(self.active))])
        if p.header.get("tap"):
            em.info([("tap", 1)])
        table = p.header.get("hybrid")
        if table is not None:
            em.info([("hybrid", len(table)), ("ansi_ops", _ops_text([int(r[0]) for r in table]))])
        if arena:
            size = int(p.header.get("arena_bytes") or 0) or self.init.arena_used
            used = min(size, self.init.arena_used) if self.init.arena_used else size
            em.arena(size, used, "host")

    def text_extra(self, em: Any, i: int) -> None:
        if self.payload.header.get("hybrid") is not None and self.init.dispatch is not None:
            ansi = len(self.init.dispatch.ansi_ops)
            em.record("HYBRID", [("i", i), ("ansi", ansi), ("fallback", self.init.fallback_ops)])
        if self._last_ops is not None:
            dump = [int(k) for k in self.payload.header.get("dump_ops", [])]
            _emit_taps(em, i, self.init.info, self._last_ops, dump)

    def sha256_hex(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def set_baud(self, baud: int) -> None:
        """The loop sent BAUD_OK: the board switches the UART once this call's output has left."""
        self.baud_request = baud

    def boot_slot(self, slot: int) -> int:
        """esp_ota_set_boot_partition: validate the image in that slot, write the next otadata entry; a slot
        no sequence number maps to (at or above the OTA-app count) is ESP_ERR_INVALID_ARG, as ESP-IDF's."""
        apps = [p for p in self.env.parts if p.is_ota_app]
        ota = find(self.env.parts, DATA, OTADATA)
        target = find(apps, APP, OTA_0 + slot)
        if target is None or ota is None:
            return 0x105  # ESP_ERR_NOT_FOUND
        try:
            load_image(self.env.chip, self.env.flash, target.offset, target.size)
        except ImageError:
            return 0x1503  # ESP_ERR_OTA_VALIDATE_FAILED
        if slot >= len(apps):
            return 0x102  # ESP_ERR_INVALID_ARG
        flash = self.env.flash
        new = otadata.select(bytes(flash[ota.offset : ota.offset + ota.size]), slot, len(apps))
        flash[ota.offset : ota.offset + len(new)] = new
        self.env.log(f"app: otadata now selects ota_{slot}")
        return 0

    def invoke(self, data: bytes) -> tuple[int, int, list[bytes]]:
        """One Invoke on the simulated CPU: the reference outputs, with the injected faults."""
        info = self.init.info
        if info is None or self.init.stage:
            return 1, 0, []
        self.runs += 1
        faults = self.env.faults
        op_fault = self.init.op_fault
        hang = "hang" in self.active or (op_fault is not None and op_fault.kind == "op_hang")
        if hang or ("stall" in self.active and self.runs > faults.fault_count):
            self.halted = True
            return -1, 0, []
        crash = next((k for k in ("panic", "abort", "brownout") if k in self.active), None)
        if crash is None and op_fault is not None and op_fault.kind == "op_panic":
            crash = "panic"
        if crash is not None:
            self.crash = crash
            return -1, 0, []
        tin = info.inputs[0]
        arr = np.frombuffer(data, np.dtype(tin.dtype)).reshape(tin.shape)
        try:
            outs = self._reference(arr, data)
        except ModelError as exc:  # TFLM (the simulated chip's kernels) crashed: a TFLITE_CHECK's abort()
            self.crash = "abort" if isinstance(exc, ReferenceRefusedError) else "panic"
            return -1, 0, []
        except (RuntimeError, HostReferenceError):  # its Invoke returned an error: so does the app's
            return 1, 0, []
        us = invoke_us(self.init.cycles, self.env.chip.cpu_mhz)
        mode = self.env.invoke_time  # "model" or seconds >= 0 (harness.sim.board.SimParams checked it)
        busy = us / 1e6 if mode == "model" else float(mode)
        tick, self._since_tick = idle_tick(self._since_tick, busy)
        self._busy += busy + tick
        raw = [_apply_output_faults(a, self.active, faults, self.runs - 1, o) for o, a in enumerate(outs)]
        if "flaky" in self.active and self.runs % 2 == 0:  # a kernel that reads uninitialised scratch
            first = bytearray(raw[0])
            first[len(first) // 2] = (first[len(first) // 2] + 1) & 0xFF
            raw[0] = bytes(first)
        return 0, us, raw

    def _reference(self, arr: np.ndarray, data: bytes) -> list[np.ndarray]:
        info = self.init.info
        op_fault = self.init.op_fault
        if self.payload.header.get("tap") or op_fault is not None:
            res = run_reference(self.payload.model, [[arr]], per_layer=True)
            layers = {lt.tensor_index: lt.array for lt in res.runs[0].layers or []}
            sim_ops, values = simulate_ops(info, arr, layers, self.init.dispatch, op_fault, self.init.cycles)
            self._last_ops = sim_ops
            return [values.get(t.index, a) for t, a in zip(info.outputs, res.runs[0].outputs, strict=True)]
        cache = self.env.cache
        key = f"out:{hashlib.sha256(self.payload.model[:4096] + data).hexdigest()}:{len(self.payload.model)}"
        hit = cache.get(key)
        if hit is None:
            hit = self._cpu(info).run(arr)
            if len(cache) > _CACHE_LIMIT:
                for k in [k for k in cache if k.startswith("out:")][: _CACHE_LIMIT // 4]:
                    del cache[k]
            cache[key] = hit
        return list(hit)

    def _cpu(self, info: Any) -> InvokeChild:
        """The board's TFLM interpreter for this model (one per model, kept in the board's cache)."""
        model = self.env.cache.get("model:" + self.model_sha)
        if not isinstance(model, InvokeChild):
            model = self.env.cache["model:" + self.model_sha] = InvokeChild(self.payload.model, info)
        return model

    # ---- the link ---------------------------------------------------------------------------------

    def rx(self, data: bytes) -> tuple[list[Piece], str | None]:
        """Bytes from the host: run what they complete; (output pieces, reboot reason or None)."""
        if self.halted or self.crash is not None:
            return [], None
        status = self.loop.rx(self._damage_incoming(bytes(data)))
        if status == ECL_REBOOT:
            self.reboot = "sw"
        elif status == ECL_HALTED and self.crash is None:
            self.halted = True
        return self._collect()

    def idle(self) -> list[Piece]:
        if self.halted or self.crash is not None:
            return []
        self.loop.idle()
        return self._collect()[0]

    def _damage_incoming(self, data: bytes) -> bytes:
        """frame_rx: one byte of every frame_every-th received frame is damaged (after its magic)."""
        if "frame_rx" not in self.active:
            return data
        out = bytearray(data)
        pos = 0
        if self._flip_at is not None and self._flip_at < len(out):
            out[self._flip_at] ^= 0x40
            self._flip_at = None
        elif self._flip_at is not None:
            self._flip_at -= len(out)
        while True:
            k = data.find(frames.MAGIC, pos)
            if k < 0:
                break
            self.frames_in += 1
            if self.frames_in % self.env.faults.frame_every == 0:
                at = k + 6  # the length field: the frame is rejected at its header
                if at < len(out):
                    out[at] ^= 0x40
                else:
                    self._flip_at = at - len(out)
            pos = k + 2
        return bytes(out)

    def _collect(self) -> tuple[list[Piece], str | None]:
        segs, self._segments, busy, self._busy = self._segments, [], self._busy, 0.0
        self.last_busy = busy  # device time the call took, output or not
        pieces = [Piece("console", bytes(d), after) for after, d in segs if d]
        pieces = self._line_faults(pieces)
        reboot = self.reboot
        if self.crash is not None:
            if self.crash == "brownout":
                text, reboot = b"\r\nBrownout detector was triggered\r\n\r\n", "brownout"
            else:  # a kernel bug: the same crash on every boot
                text = panic_text(
                    self.env.chip, self.crash, elf_sha=self.elf_sha, variant=self.payload.variant
                )
                reboot = "sw"
            pieces.append(Piece("console", text, busy))
        return pieces, reboot

    def _line_faults(self, pieces: list[Piece]) -> list[Piece]:
        """Console faults on the app's output: watchdog splice, truncation, disconnect (once, in the first
        output with enough text records), noise (everywhere)."""
        active = self.active
        out: list[Piece] = []
        wanted = {"wdt", "truncate", "disconnect"} & set(active)
        if wanted and not self._line_fault_done and sum(p.data.count(MARKER) for p in pieces) > 2:
            pieces = [Piece("console", b"".join(p.data for p in pieces), pieces[0].at)]  # one stretch
        for p in pieces:
            data = p.data
            if not self._line_fault_done and data.count(MARKER) > 2:
                data, event = _text_faults(data, active, self.env.faults, self.env.boot_index)
                if data is not p.data or event is not None:
                    self._line_fault_done = True
                if event is not None:
                    out.append(Piece("console", data, p.at))
                    if event == "disconnect":
                        out.append(Piece("disconnect", b"", p.at))
                    self.halted = True
                    return out
            if "noise" in active:
                data = flip_bits(
                    data, self.env.faults.noise, self.env.faults.rng("noise", self.env.boot_index)
                )
            out.append(Piece(p.kind, data, p.at))
        return out


def _flash_size_text(detected: int, header: int, relation: str) -> str:
    """ESP-IDF's spi_flash start-up message when the chip and the image header disagree on the size."""
    tail = "Probe failed." if relation == "smaller" else "Using the size in the binary image header."
    return (
        f"Detected size({detected // 1024}k) {relation} than the size in the binary image header"
        f"({header // 1024}k). {tail}"
    )


KEEP_PLACE = 0x3D000000  # where both simulated apps place the store (an S3's PSRAM data address)
COLD_BOOTS = ("poweron", "usb")  # boots that start with noise in PSRAM (a power-on, the EN pin, a USB reset)


def keep_after_boot(mem: bytearray, reason: str, faults: FaultSpec, boot: int) -> None:
    """What a boot leaves in the kept-input store's PSRAM (``mem``): a restart (software, panic, watchdog)
    leaves it alone, as ``EXT_RAM_NOINIT_ATTR`` memory; a cold boot leaves noise. The keep faults act at
    every warm restart (``keep_lost``: at app boot number ``fault_count`` only)."""
    lost = faults.active("keep_lost") and boot == faults.fault_count
    if reason in COLD_BOOTS or faults.active("keep_cold") or lost:
        mem[:] = faults.rng("keep_cold", boot).randbytes(len(mem))
        return
    magic, size, cap, nonce, region, sha, place = loop.KEEP_HEAD.unpack_from(mem)
    if magic != frames.KEEP_MAGIC:
        return
    if faults.active("keep_stale"):  # another model's store: its own CRC is valid
        other = hashlib.sha256(sha).digest()
        mem[: frames.KEEP_HEADER] = loop.keep_header(size, cap, nonce, region, other, place)
    if faults.active("keep_flip"):
        for k in range(cap):
            at = loop.keep_slot(size, cap, k) + (k * 7919) % max(size, 1)
            if at < len(mem):
                mem[at] ^= 0x01


FREERTOS_TICK_S = 0.01  # ESP-IDF's default CONFIG_FREERTOS_HZ=100
IDLE_QUIET_S = FREERTOS_TICK_S  # no byte for this long and the app calls ecl_idle (kIdleQuietTicks, 1 tick)
IDLE_TICK_EVERY_S = 1.0  # app_main.cc's kIdleTickEveryUs: one tick at most once a second of invokes


def idle_tick(since_tick: float, busy: float) -> tuple[float, float]:
    """The firmware's idle-task tick in the time model: (extra busy seconds for this invoke, busy seconds
    since the last tick). Back-to-back invokes sleep one FreeRTOS tick once a second of them, as the
    generated app_main.cc does; an invoke that takes no modelled time adds none."""
    since = since_tick + busy
    if busy > 0 and since >= IDLE_TICK_EVERY_S:
        return FREERTOS_TICK_S, 0.0
    return 0.0, since


def _op_fault(faults: FaultSpec, dispatch: Any, info: Any) -> Any:
    """The op fault of this image, or None when there is none or it hits no op this image runs."""
    kind = next((k for k in OP_FAULTS if k in faults.names), None)
    if kind is None or not faults.fault_ops:
        return None
    fault = OpFault(
        kind,
        faults.fault_ops[0],
        faults.fault_region,
        lsb=faults.corrupt_lsb,
        frac=faults.corrupt_frac,
        seed=faults.seed,
        more_ops=faults.fault_ops[1:],
        variant=faults.variant,
    )
    return fault if any(fault.hits(op.index, dispatch) for op in info.main_ops) else None


def _ops_text(ops: list[int], limit: int = 160) -> str:
    """INFO ansi_ops as the firmware prints it: ``17,27``, cut with a trailing ``+`` past ``limit``."""
    text = ""
    for k, op in enumerate(ops):
        one = f"{',' if k else ''}{op}"
        if len(text) + len(one) + 2 > limit + 1:
            return text + "+"
        text += one
    return text or "-"


def _emit_taps(emitter: Any, i: int, info: Any, sim_ops: list[Any], dump_ops: list[int]) -> None:
    """OP records, OPEND and the chosen ops' dumps, as the --tap firmware prints them after Invoke."""
    for so in sim_ops:
        emitter.op(
            i, 0, so.op.index, opname=so.op.opcode, cycles=so.cycles,
            ins=[TapTensor(t, tuple(a.shape), crc32(a)) for t, a in so.inputs],
            outs=[TapTensor(t, tuple(a.shape), crc32(a)) for t, a in so.outputs],
        )  # fmt: skip
    dumps = [(so, role, t, a) for so in sim_ops if so.op.index in dump_ops
             for role, side in (("in", so.inputs), ("out", so.outputs)) for t, a in side]  # fmt: skip
    ram = TAP_RECORD_BYTES * len(sim_ops) + sum((a.nbytes + 3) // 4 * 4 for *_, a in dumps)
    emitter.op_end(i, len(sim_ops), 0, ram)
    for so, role, t, a in dumps:
        ti = info.tensors[t]
        meta = (str(a.dtype), list(a.shape), float(ti.scale or 0.0), int(ti.zero_point or 0))  # dtype .. zp
        emitter.op_dump(i, so.op.index, t, role, *meta, a.tobytes())


def _apply_output_faults(arr: np.ndarray, active: list[str], faults: FaultSpec, i: int, o: int) -> bytes:
    a = np.array(arr, copy=True)
    if "pinned" in active:
        lim = np.iinfo(a.dtype) if a.dtype.kind in "iu" else None
        a[...] = lim.min if lim is not None else 0
    if "corrupt" in active:
        rng = faults.rng("corrupt", i * 1000 + o)  # the same elements on every boot: a kernel bug, not noise
        a = bump_lsb(a, region_mask(a.shape, "random", rng, faults.corrupt_frac), faults.corrupt_lsb)
    return a.tobytes()


def _text_faults(data: bytes, active: list[str], faults: FaultSpec, boot: int) -> tuple[bytes, str | None]:
    """wdt: a watchdog line spliced into a record; truncate / disconnect: the output stops inside the
    records (the event, if any, is returned)."""
    if "wdt" in active:
        lines = data.split(b"\n")
        cands = [k for k, ln in enumerate(lines) if MARKER in ln and (b" DATA " in ln or b" TENSOR " in ln)]
        if cands:
            rng = faults.rng("wdt", boot)
            k = rng.choice(cands)
            ln = lines[k]
            cut = rng.randrange(ln.index(MARKER) + len(MARKER) + 1, len(ln) - 2)
            msg = (
                b"E (5312) task_wdt: Task watchdog got triggered. The following tasks/users did not "
                b"reset the watchdog in time:\r\n"
            )
            lines[k] = ln[:cut] + msg + ln[cut:]
            lines.insert(k + 1, b"E (5312) task_wdt:  - IDLE0 (CPU 0)\r")
            data = b"\n".join(lines)
    for name in ("truncate", "disconnect"):
        if name in active:
            marks = [m for m in range(len(data)) if data.startswith(MARKER, m)]
            rng = faults.rng(name, boot)
            k = rng.randrange(len(marks) // 2, len(marks) - 1)
            cut = rng.randrange(marks[k] + len(MARKER), marks[k + 1])
            return data[:cut], name
    return data, None
