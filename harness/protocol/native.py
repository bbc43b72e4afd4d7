"""The firmware's portable C (frames, command loop) driven through ctypes, from the C emitter's library
(:func:`harness.protocol.emitter.build_c_library`; docs/protocol.md "Binary frames and the resident loop")."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from harness.protocol import frames
from harness.protocol.emitter import MAX_DIMS, CEmitter, PythonEmitter, find_c_compiler, load_c_library
from harness.protocol.loop import DeviceLoop, LoopConfig, LoopHost

_u8p = ctypes.POINTER(ctypes.c_uint8)


class _Frame(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("seq", ctypes.c_uint16),
        ("len", ctypes.c_uint16),
        ("payload", _u8p),
    ]


class _Decoder(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_uint8 * frames.MAX_FRAME),
        ("have", ctypes.c_size_t),
        ("max_payload", ctypes.c_size_t),
        ("frames", ctypes.c_uint32),
        ("bad_headers", ctypes.c_uint32),
        ("bad_crc", ctypes.c_uint32),
        ("skipped", ctypes.c_uint32),
        ("key", ctypes.c_uint32),
    ]


class _Output(ctypes.Structure):
    _fields_ = [
        ("data", _u8p),
        ("bytes", ctypes.c_size_t),
        ("dtype", ctypes.c_char_p),
        ("dims", ctypes.c_int32 * MAX_DIMS),
        ("ndims", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("zp", ctypes.c_int32),
        ("name", ctypes.c_char_p),
    ]


_FRAME_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Frame))
_WRITE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, _u8p, ctypes.c_size_t)
_INVOKE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, _u8p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32)
)
_SESSION = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32)
_EXTRA = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
_SHA = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _u8p, ctypes.c_size_t, ctypes.c_void_p)
_BOOT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint8)
_BAUD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32)


class _Config(ctypes.Structure):
    _fields_ = [
        ("write", _WRITE),
        ("invoke", _INVOKE),
        ("session_begin", _SESSION),
        ("text_extra", _EXTRA),
        ("sha256_hex", _SHA),
        ("boot_slot", _BOOT),
        ("ctx", ctypes.c_void_p),
        ("ecp", ctypes.c_void_p),
        ("staging", _u8p),
        ("input_bytes", ctypes.c_size_t),
        ("input_dtype", ctypes.c_uint8),
        ("outputs", ctypes.POINTER(_Output)),
        ("n_outputs", ctypes.c_size_t),
        ("window", ctypes.c_uint32),
        ("human_max", ctypes.c_int32),
        ("sim", ctypes.c_uint8),
        ("tap", ctypes.c_uint8),
        ("nn", ctypes.c_uint8),
        ("slot", ctypes.c_uint8),
        ("init_status", ctypes.c_uint8),
        ("model_sha256", _u8p),
        ("fwver", ctypes.c_char_p),
        ("session", ctypes.c_uint32),
        ("app_sha256", _u8p),
        ("other_sha256", _u8p),
        ("set_baud", _BAUD),
        ("keep", _u8p),
        ("keep_bytes", ctypes.c_size_t),
        ("keep_place", ctypes.c_uint32),
    ]


def load_library() -> ctypes.CDLL:
    """The compiled portable C (built once per source hash), with the emitter's, the frame and the loop
    signatures set: one handle for the caller to own (a loop and its emitter share it)."""
    vp, cp, sz, cint = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int
    u8, u32, dec = ctypes.c_uint8, ctypes.c_uint32, ctypes.POINTER(_Decoder)
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "ecf_encode_keyed": (sz, [_u8p, sz, u8, u8, ctypes.c_uint16, cp, sz, u32]),
        "ecf_decoder_set_key": (None, [dec, u32]),
        "ecf_decoder_init": (None, [dec, sz]),
        "ecf_decoder_sizeof": (sz, []),
        "ecf_decoder_feed": (None, [dec, cp, sz, _FRAME_CB, vp]),
        "ecf_prng_fill": (None, [ctypes.c_uint64, u32, u8, _u8p, sz]),
        "ecl_sizeof": (sz, []),
        "ecl_init": (cint, [vp, ctypes.POINTER(_Config)]),
        "ecl_hello": (None, [vp]),
        "ecl_rx": (cint, [vp, cp, sz]),
        "ecl_idle": (cint, [vp]),
        "ecl_error": (None, [vp, u32, u8, ctypes.c_int32, cp]),
    }
    lib = load_c_library(more=sigs)
    if lib.ecf_decoder_sizeof() != ctypes.sizeof(_Decoder):
        raise RuntimeError("ecf_decoder_t layout differs from harness.protocol.native's mirror")
    return lib


class CDeviceLoop:
    """esp_check_loop.c driven through ctypes, with the same interface as :class:`DeviceLoop`."""

    def __init__(self, lib: ctypes.CDLL, cfg: LoopConfig, host: LoopHost, emitter: CEmitter) -> None:
        self.lib, self.cfg, self.host, self.emitter = lib, cfg, host, emitter
        self.staging = (ctypes.c_uint8 * max(cfg.input_bytes, 1))()
        self._out_bufs = [(ctypes.c_uint8 * max(o.bytes, 1))() for o in cfg.outputs]
        self._outs = (_Output * max(len(cfg.outputs), 1))()
        self._keep: list[Any] = []
        for k, (o, buf) in enumerate(zip(cfg.outputs, self._out_bufs, strict=True)):
            dims = (ctypes.c_int32 * MAX_DIMS)(*o.shape[:MAX_DIMS])
            data, dtype, name = ctypes.cast(buf, _u8p), self._c(o.dtype), self._c(o.name)
            self._outs[k] = _Output(data, o.bytes, dtype, dims, len(o.shape), o.scale, zp=o.zp, name=name)
        shas = (cfg.model_sha256, cfg.app_sha256, cfg.other_sha256)
        self._shas = [
            (ctypes.c_uint8 * 32).from_buffer_copy(bytes.fromhex(h) if h else bytes(32)) for h in shas
        ]
        self._raised: BaseException | None = None  # what a callback raised, re-raised when C returns
        self._callbacks = self._make_callbacks()
        c = _Config(*self._callbacks)
        for key in ("input_bytes", "window", "human_max", "sim", "tap", "init_status"):
            setattr(c, key, getattr(cfg, key))  # the C field of that name means the same
        c.ecp = ctypes.cast(emitter.state, ctypes.c_void_p)
        c.staging = ctypes.cast(self.staging, _u8p)
        c.input_dtype = frames.DTYPE_CODES.get(cfg.input_dtype, 0)
        c.outputs = self._outs
        c.n_outputs = len(cfg.outputs)
        c.nn = frames.NN_CODES.get(cfg.nn, 0)
        c.slot = 0xFF if cfg.slot is None else cfg.slot
        c.model_sha256, c.app_sha256, c.other_sha256 = (ctypes.cast(b, _u8p) for b in self._shas)
        c.fwver = self._c(cfg.fwver)
        c.session = cfg.session & 0xFFFFFFFF
        host_ = self.host
        self._baud_cb = _BAUD(self._guard(lambda _ctx, baud: host_.set_baud(int(baud)), None))
        c.set_baud = self._baud_cb if cfg.baud_switch else _BAUD()  # NULL: BAUD refused
        if cfg.keep is not None and len(cfg.keep) > 0:  # the store is the board's memory: shared, not copied
            self._keep_mem = (ctypes.c_uint8 * len(cfg.keep)).from_buffer(cfg.keep)
            c.keep = ctypes.cast(self._keep_mem, _u8p)
            c.keep_bytes = len(cfg.keep)
            c.keep_place = cfg.keep_place & 0xFFFFFFFF
        self._config = c
        self.state = ctypes.create_string_buffer(int(lib.ecl_sizeof()))
        if lib.ecl_init(self.state, ctypes.byref(c)) != 0:
            raise ValueError("the C loop refused its configuration (too many outputs?)")

    def _c(self, s: str) -> bytes:
        b = s.encode("utf-8", "replace")
        self._keep.append(b)
        return b

    def _guard(self, fn: Callable[..., Any], failed: int | None) -> Callable[..., Any]:
        """``fn`` as a C callback: an exception is kept and re-raised once the C call returns (as the
        Python twin's leaves ``rx``); C gets ``failed`` (an invoke halts), not ctypes' undefined value."""

        def call(*args: Any) -> Any:
            try:
                return fn(*args)
            except BaseException as exc:
                self._raised = self._raised or exc
                return failed

        return call

    def _checked(self, rc: int) -> int:
        raised, self._raised = self._raised, None
        if raised is not None:
            raise raised
        return int(rc)

    def _make_callbacks(self) -> tuple[Any, ...]:
        host, em = self.host, self.emitter

        def write(_ctx: Any, buf: Any, n: int) -> int:
            host.write(ctypes.string_at(buf, n))
            return int(n)

        def invoke(_ctx: Any, data: Any, n: int, us: Any) -> int:
            rc, t, outs = host.invoke(ctypes.string_at(data, n))
            if rc == 0:
                for buf, b in zip(self._out_bufs, outs, strict=True):
                    ctypes.memmove(buf, b, len(b))
                us[0] = t & 0xFFFFFFFF
            return int(rc)

        def session(_ctx: Any, _e: Any, inputs: int) -> None:
            em._sync()
            host.session_begin(em, int(inputs))

        def extra(_ctx: Any, _e: Any, i: int) -> None:
            em._sync()
            host.text_extra(em, int(i))

        def sha(_ctx: Any, data: Any, n: int, out: Any) -> None:
            hexd = host.sha256_hex(ctypes.string_at(data, n)).encode("ascii")[:64]
            ctypes.memmove(out, hexd + b"\0", len(hexd) + 1)

        def boot(_ctx: Any, slot: int) -> int:
            return int(host.boot_slot(int(slot)))

        guard = self._guard
        return (
            _WRITE(guard(write, -1)),
            _INVOKE(guard(invoke, -1)),
            _SESSION(guard(session, None)),
            _EXTRA(guard(extra, None)),
            _SHA(guard(sha, None)),
            _BOOT(guard(boot, -1)),
        )

    def rx(self, data: bytes) -> int:
        return self._checked(self.lib.ecl_rx(self.state, bytes(data), len(data)))

    def idle(self) -> int:
        return self._checked(self.lib.ecl_idle(self.state))

    def hello(self) -> None:
        self.lib.ecl_hello(self.state)
        self._checked(0)

    def error(self, ident: int, stage: int, code: int, msg: str) -> None:
        msg_c = msg.encode("utf-8", "replace")
        self.lib.ecl_error(self.state, ident & 0xFFFFFFFF, stage, code, msg_c)
        self._checked(0)


def make_loop(cfg: LoopConfig, host: LoopHost, *, backend: str = "auto") -> DeviceLoop | CDeviceLoop:
    """The device loop for the simulated board: the firmware's C loop, or its Python twin."""
    if backend == "python" or (backend == "auto" and find_c_compiler() is None):
        return DeviceLoop(cfg, host, PythonEmitter(host.write))
    lib = load_library()
    return CDeviceLoop(lib, cfg, host, CEmitter(host.write, lib))


__all__ = ["CDeviceLoop", "load_library", "make_loop"]
