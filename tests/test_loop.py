"""The resident command loop (docs/protocol.md "Resident loop"): esp_check_loop.c and its Python twin.

What is faked: the model. ``App.invoke`` stands in for TFLM (outputs derived from the input bytes by
hashing, with an optional non-deterministic invoke); everything else -- frame codec, command handling,
flow control, batching, text records -- is the firmware's own C (through ctypes) or its Python twin,
and both must print byte-identical streams for the same commands.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from harness.protocol import frames as fr
from harness.protocol.capture import parse_capture
from harness.protocol.emitter import find_c_compiler
from harness.protocol.loop import LoopConfig, LoopOutput
from harness.protocol.native import CDeviceLoop, make_loop

HAVE_CC = find_c_compiler() is not None
BACKENDS = ["python", pytest.param("c", marks=pytest.mark.skipif(not HAVE_CC, reason="no host C compiler"))]
COMMON = Path(__file__).resolve().parent.parent / "firmware_templates" / "common"
OUT_BYTES = (2304, 11)


class App:
    """The application side of the loop, with a stand-in model (see the module docstring)."""

    def __init__(
        self, *, flaky_invoke: int | None = None, fail_first_byte: int | None = None, invoke_us: int = 0
    ) -> None:
        self.out = bytearray()
        self.invoke_us = invoke_us  # a modelled invoke time (0: ~1 ms)
        self.invokes = 0
        self.flaky_invoke = flaky_invoke
        self.fail_first_byte = fail_first_byte
        self.booted: list[int] = []
        self.bauds: list[tuple[int, int]] = []

    def write(self, data: bytes) -> None:
        self.out += data

    def invoke(self, data: bytes) -> tuple[int, int, list[bytes]]:
        self.invokes += 1
        if self.fail_first_byte is not None and data[:1] == bytes([self.fail_first_byte]):
            return 3, 0, []
        h = hashlib.sha256(data).digest()
        outs = [(h * 80)[: OUT_BYTES[0]], h[: OUT_BYTES[1]]]
        if self.invokes == self.flaky_invoke:
            outs[1] = bytes(OUT_BYTES[1])
        return 0, self.invoke_us or 1000 + len(data) % 97, outs

    def session_begin(self, em, inputs: int) -> None:  # type: ignore[no-untyped-def]
        em.begin("0.1.0", True)
        em.info([("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"),
                 ("cores", 2), ("cpu_mhz", 240)])  # fmt: skip
        em.info([("idf", "v5.5.3"), ("tflm", "sim"), ("espnn", "sim"), ("model_bytes", 1000),
                 ("inputs", inputs), ("outputs", 2)])  # fmt: skip
        em.info([("model_sha256", "ab" * 32)])
        em.arena(4096, 2048, "host")

    def text_extra(self, em, i: int) -> None:  # type: ignore[no-untyped-def]
        return None

    def sha256_hex(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def boot_slot(self, slot: int) -> int:
        self.booted.append(slot)
        return 0 if slot == 1 else 0x103

    def set_baud(self, baud: int) -> None:
        self.bauds.append((baud, len(self.out)))  # what had been written when the switch came


SESSION = 0x5EED5EED  # the boot's session id in these tests: every command frame carries its key
KEY = fr.key_crc(SESSION, "optimized")


def config(window: int = 16384) -> LoopConfig:
    return LoopConfig(
        input_bytes=6912, input_dtype="int8", window=window, nn="optimized", slot=0, model_sha256="ab" * 32,
        session=SESSION,
        outputs=[LoopOutput(OUT_BYTES[0], "int8", (1, 48, 48, 1), 0.5, -3, "mask"),
                 LoopOutput(OUT_BYTES[1], "int8", (1, 11), 0.25, 0, "class")],
    )  # fmt: skip


class Script:
    """Host-side command frames with consecutive sequence numbers."""

    def __init__(self, key: int = KEY) -> None:
        self.frames: list[bytes] = []
        self.seq = 0
        self.key = key

    def add(self, ftype: int, payload: bytes = b"") -> Script:
        self.frames.append(fr.encode_frame(ftype, self.seq, payload, key=self.key))
        self.seq += 1
        return self

    def load(self, data: bytes, chunk: int = 4000) -> Script:
        for off in range(0, len(data), chunk):
            self.add(fr.CMD_LOAD, fr.encode_load(off, data[off : off + chunk]))
        return self

    def run(self, ident: int, **kw: object) -> Script:
        return self.add(fr.CMD_RUN, fr.encode_run(ident, **kw))  # type: ignore[arg-type]


def play(backend: str, frames: list[bytes], app: App | None = None, cfg: LoopConfig | None = None) -> App:
    app = app or App()
    loop = make_loop(cfg or config(), app, backend=backend)
    loop.hello()
    for f in frames:
        loop.rx(f)
    loop.idle()
    return app


def responses(app: App) -> tuple[list[fr.Frame], dict[int, fr.ResultRecord], bytes]:
    split = fr.split_stream(bytes(app.out))
    results: dict[int, fr.ResultRecord] = {}
    for f in split.frames:
        if f.type == fr.RSP_RESULT:
            for r in fr.decode_results(f.payload, OUT_BYTES):
                results[r.ident] = r
        elif f.type == fr.RSP_DATA:
            d = fr.decode_data(f.payload)
            results[d.ident].pending.setdefault(d.output, bytearray()).extend(d.data)
    return split.frames, results, split.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_loaded_and_random_inputs_run_with_full_and_crc_results(backend: str) -> None:
    data = random.Random(1).randbytes(6912)
    s = Script().load(data).run(0, results=fr.RES_FULL)
    s.run(1, source=fr.SRC_PRNG, seed=77, results=fr.RES_CRC)
    frames, res, _ = responses(play(backend, s.add(fr.CMD_SYNC, b"tok1").frames))
    names = [f.name for f in frames]
    assert names[0] == "HELLO" and names[-2:] == ["SYNC_ACK", "ACK"]  # idle: ACK what was consumed
    assert frames[-2].payload == b"tok1"
    hello = fr.decode_hello(frames[0].payload)
    got = (hello.nn, hello.input_bytes, hello.output_bytes, hello.window)
    assert got == ("optimized", 6912, OUT_BYTES, 16384)
    want = App().invoke(data)[2]
    assert res[0].input_crc == fr.crc32(data) and res[0].data == want
    assert res[0].crcs == tuple(fr.crc32(b) for b in want)
    prng = fr.prng_bytes(77, 1, "int8", 6912)  # the host's replica of the device PRNG
    assert res[1].input_crc == fr.crc32(prng) and res[1].data is None
    assert res[1].crcs == tuple(fr.crc32(b) for b in App().invoke(prng)[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_data_only_when_a_crc_differs_from_expected(backend: str) -> None:
    right = tuple(fr.crc32(b) for b in App().invoke(fr.prng_bytes(5, 3, "int8", 6912))[2])
    s = Script().run(3, source=fr.SRC_PRNG, seed=5, results=fr.RES_FULL_IF_DIFFERENT, expected=right)
    s.run(4, source=fr.SRC_PRNG, seed=5, results=fr.RES_FULL_IF_DIFFERENT, expected=(right[0], 0))
    _, res, _ = responses(play(backend, s.frames))
    assert res[3].data is None
    assert res[4].data is not None and res[4].flags & fr.FL_INLINE


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeat_flags_a_nondeterministic_invoke(backend: str) -> None:
    s = Script().run(0, source=fr.SRC_PRNG, seed=1, repeat=4, results=fr.RES_CRC)
    _, res, _ = responses(play(backend, s.frames, App(flaky_invoke=3)))
    r = res[0]
    assert r.repeats == 4 and r.nondeterministic and r.diff_repeat == 2
    assert r.diff_crcs is not None and r.diff_crcs[0] == r.crcs[0] and r.diff_crcs[1] != r.crcs[1]
    _, res, _ = responses(play(backend, s.frames, App()))
    assert not res[0].nondeterministic and res[0].repeats == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_outputs_go_in_data_frames(backend: str) -> None:
    """An output larger than one device frame (16 KiB) follows its record in DATA frames."""
    big = 20000
    cfg = config()
    cfg.outputs = [LoopOutput(big, "int8", (1, big), 1.0, 0, "big")]

    class Big(App):
        def invoke(self, data: bytes) -> tuple[int, int, list[bytes]]:
            return 0, 9, [(hashlib.sha256(data).digest() * 700)[:big]]

    app = play(backend, Script().run(0, source=fr.SRC_PRNG, seed=2).frames, Big(), cfg)
    split = fr.split_stream(bytes(app.out))
    results = [f for f in split.frames if f.type == fr.RSP_RESULT]
    (rec,) = [r for f in results for r in fr.decode_results(f.payload, [big])]
    chunks = [fr.decode_data(f.payload) for f in split.frames if f.type == fr.RSP_DATA]
    assert rec.wants_data_frames and [c.offset for c in chunks] == [0, fr.TX_MAX_PAYLOAD - fr.DATA_FIXED]
    assert b"".join(c.data for c in chunks) == Big().invoke(fr.prng_bytes(2, 0, "int8", 6912))[2][0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_results_are_batched(backend: str) -> None:
    s = Script()
    for i in range(40):
        s.run(i, source=fr.SRC_PRNG, seed=3, results=fr.RES_CRC)
    frames, res, _ = responses(play(backend, s.frames))
    result_frames = [f for f in frames if f.type == fr.RSP_RESULT]
    assert sorted(res) == list(range(40)) and len(result_frames) == 1  # all 40 records in one frame


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_errors_are_reported_not_run(backend: str) -> None:
    s = Script().add(fr.CMD_LOAD, fr.encode_load(6900, bytes(20)))  # beyond the input tensor
    s.add(fr.CMD_LOAD, fr.encode_load(0, bytes(100))).run(7)  # incomplete input
    s.add(fr.CMD_RUN, b"\x01\x02")  # malformed RUN
    s.add(0x3F)  # unknown command
    app = play(backend, s.frames)
    frames, res, _ = responses(app)
    errors = [fr.decode_error(f.payload) for f in frames if f.type == fr.RSP_ERROR]
    assert [(e.stage, e.msg) for e in errors] == [("input", "load_beyond_input_tensor"),
                                                  ("protocol", "bad_run_command"),
                                                  ("protocol", "unknown_command")]  # fmt: skip
    assert res[7].status == fr.ST_INPUT_INCOMPLETE and app.invokes == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_invoke_failure_is_a_status(backend: str) -> None:
    s = Script().load(b"\xee" + bytes(6911)).run(0, results=fr.RES_FULL)
    _, res, _ = responses(play(backend, s.frames, App(fail_first_byte=0xEE)))
    assert res[0].status == fr.ST_INVOKE_FAILED and res[0].invoke_us == 3 and res[0].data is None


class _RaisingApp(App):
    def invoke(self, data: bytes) -> tuple[int, int, list[bytes]]:
        raise RuntimeError("the host's model refused")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exception_in_the_hosts_invoke_leaves_rx_and_no_result_is_sent(backend: str) -> None:
    """Both loops let the host's exception out of ``rx`` (the C loop's ctypes callback used to swallow it
    and hand C an undefined status), and nothing is reported for the input."""
    app = _RaisingApp()
    loop = make_loop(config(), app, backend=backend)
    loop.hello()
    with pytest.raises(RuntimeError, match="refused"):
        for f in Script().run(0, source=fr.SRC_PRNG, results=fr.RES_FULL).frames:
            loop.rx(f)
    _, res, _ = responses(app)
    assert res == {}


class _RaisingBaudApp(App):
    def set_baud(self, baud: int) -> None:
        raise OSError("the UART refused the baud")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exception_in_the_hosts_baud_switch_leaves_rx(backend: str) -> None:
    """The BAUD callback is guarded like the others: its exception leaves ``rx`` on both loops."""
    loop = make_loop(dataclasses.replace(config(), baud_switch=True), _RaisingBaudApp(), backend=backend)
    with pytest.raises(OSError, match="refused the baud"):
        loop.rx(Script().add(fr.CMD_BAUD, struct.pack("<I", 921600)).frames[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupted_lost_and_repeated_frames(backend: str) -> None:
    s = Script().run(0, source=fr.SRC_PRNG, results=fr.RES_CRC).run(1, source=fr.SRC_PRNG, results=fr.RES_CRC)
    good = list(s.frames)
    bad = bytearray(good[1])
    bad[14] ^= 0x10
    # frame 1 corrupted, frame 1 lost entirely, frame 0 repeated, then the retransmission
    stream = [good[0], bytes(bad), good[0], good[1]]
    frames, res, _ = responses(play(backend, stream))
    naks = [fr.decode_nak(f.payload) for f in frames if f.type == fr.RSP_NAK]
    assert naks == [(1, fr.NAK_BAD_FRAME)]
    assert sorted(res) == [0, 1]  # each run exactly once, in order
    gap = responses(play(backend, [good[1], good[0], good[1]]))[0]
    assert [fr.decode_nak(f.payload) for f in gap if f.type == fr.RSP_NAK] == [(0, fr.NAK_GAP)]


def _acks(f: fr.Frame) -> bool:
    """An ACK frame, or a RESULT frame with an ACK folded in."""
    return f.type == fr.RSP_ACK or (f.type == fr.RSP_RESULT and f.ack is not None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_acks_follow_the_window(backend: str) -> None:
    data = bytes(6912)
    s = Script()
    for i in range(6):
        s.load(data).run(i, results=fr.RES_CRC)
    cfg = config(window=8192)
    frames, _, _ = responses(play(backend, s.frames, cfg=cfg))
    acks = [fr.decode_ack(f.payload) if f.type == fr.RSP_ACK else f.ack for f in frames if _acks(f)]
    sizes = [len(f) for f in s.frames]
    # every ACK names the next expected seq; between two ACKs at least window/2 bytes went by (the buffer
    # ran empty only at the end): half as many ACK frames as at window/4, which uploads paid per input
    assert acks[-1] == len(s.frames) and acks == sorted(acks)
    prev = 0
    for a in acks[:-1]:
        assert sum(sizes[prev:a]) >= cfg.window // 2
        prev = a


@pytest.mark.parametrize("backend", BACKENDS)
def test_text_session_prints_a_valid_capture(backend: str) -> None:
    inputs = [random.Random(k).randbytes(6912) for k in range(2)]
    s = Script().add(fr.CMD_SESSION, struct.pack("<I", 2))
    for k, data in enumerate(inputs):
        s.load(data).run(k, text=True)
    s.add(fr.CMD_END)
    _, _, text = responses(play(backend, s.frames))
    cap = parse_capture(bytes(play(backend, s.frames).out))  # frames (HELLO, ACKs) interleaved
    assert cap.valid, cap.problems
    assert [r.input_sha256 for r in cap.runs] == [hashlib.sha256(d).hexdigest() for d in inputs]
    assert [r.outputs[1].data.tobytes() for r in cap.runs] == [App().invoke(d)[2][1] for d in inputs]
    assert b"Output: " in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_boot_switch_reply_then_reboot(backend: str) -> None:
    from harness.protocol.loop import ECL_REBOOT

    app = App()
    loop = make_loop(config(), app, backend=backend)
    assert loop.rx(Script().add(fr.CMD_BOOT, b"\x00").frames[0]) == 0  # refused: no reboot
    s = Script()
    s.seq = 1
    assert loop.rx(s.add(fr.CMD_BOOT, b"\x01").frames[0]) == ECL_REBOOT
    replies = [fr.decode_boot(f.payload) for f in fr.split_stream(bytes(app.out), key=KEY).frames]
    assert replies == [(0, 0x103), (1, 0)] and app.booted == [0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_baud_switch_reply_leaves_before_the_switch(backend: str) -> None:
    """BAUD: the device answers BAUD_OK (baud, 0) and only then switches (the reply leaves at the old
    baud); out of range or on a console that cannot switch (USB-Serial-JTAG: no callback) it refuses."""
    app = App()
    loop = make_loop(dataclasses.replace(config(), baud_switch=True), app, backend=backend)
    s = Script().add(fr.CMD_BAUD, struct.pack("<I", 921600)).add(fr.CMD_BAUD, struct.pack("<I", 1200))
    for f in s.frames:
        loop.rx(f)
    frames = fr.split_stream(bytes(app.out), key=KEY).frames
    replies = [fr.decode_baud(f.payload) for f in frames if f.type == fr.RSP_BAUD]
    assert replies == [(921600, 0), (1200, -1)]
    assert [b for b, _ in app.bauds] == [921600]
    first_reply_end = bytes(app.out).find(fr.MAGIC) + fr.HEADER + 8 + fr.TRAILER
    assert app.bauds[0][1] == first_reply_end  # the switch came right after the whole reply was written
    fixed = App()
    loop = make_loop(config(), fixed, backend=backend)  # baud_switch off: refused, nothing switched
    loop.rx(Script().add(fr.CMD_BAUD, struct.pack("<I", 921600)).frames[0])
    out = fr.split_stream(bytes(fixed.out), key=KEY).frames
    assert [fr.decode_baud(f.payload) for f in out if f.type == fr.RSP_BAUD] == [(921600, -1)]
    assert fixed.bauds == []


def _script(rng: random.Random) -> list[bytes]:
    s = Script()
    loaded: bytes = b""
    kept: dict[int, int] = {}  # ids stored with keep=1 -> their CRC-32 (RUN source=kept names it)
    for _ in range(rng.randrange(1, 25)):
        k = rng.random()
        if k < 0.3:
            loaded = rng.randbytes(rng.choice([6912, 100, 7000]))
            s.load(loaded, rng.choice([1000, 4000]))
        elif k < 0.7:
            src = rng.randrange(3)
            ident = rng.randrange(100) if src != fr.SRC_KEPT else rng.randrange(4)
            keep = src == fr.SRC_LOADED and rng.random() < 0.5
            if keep:
                ident = rng.randrange(4)
                kept[ident] = fr.crc32(loaded)
            seed = rng.getrandbits(64)
            if src == fr.SRC_KEPT and ident in kept and rng.random() < 0.8:
                seed = kept[ident]
            exp = rng.choice([(), (rng.getrandbits(32), rng.getrandbits(32))])
            s.run(ident, source=src, results=rng.randrange(3), repeat=rng.randrange(1, 4), seed=seed,
                  expected=exp, keep=keep)  # fmt: skip
    out = []
    for f in s.frames:
        r = rng.random()
        if r < 0.05:
            f = bytes(b ^ (1 if i == rng.randrange(len(f)) else 0) for i, b in enumerate(f))
        elif r < 0.08:
            continue  # lost
        out.append(f)
        if rng.random() < 0.03:
            out.append(f)  # duplicated
    return out


@pytest.mark.skipif(not HAVE_CC, reason="no host C compiler")
def test_c_loop_and_python_twin_print_identical_streams() -> None:
    rng = random.Random(1130)
    keep_c, keep_py = bytearray(64 + 8 * 3 + 16 + 3 * 6912 + 50), bytearray(64 + 8 * 3 + 16 + 3 * 6912 + 50)
    for trial in range(150):
        script = _script(rng)
        # the 16 KiB window of a board without PSRAM, the 64 KiB one of a board with it (an ACK per half)
        cfg = dataclasses.replace(config(16384 if trial % 4 < 2 else 65536), baud_switch=trial % 2 == 0)
        if trial % 3:  # a kept-input store that lives across the trials, as across restarts
            cfg_c = dataclasses.replace(
                cfg, keep=keep_c, keep_place=0x3D000000 + trial % 2, session=trial + 1
            )
            cfg_py = dataclasses.replace(cfg_c, keep=keep_py)
        else:
            cfg_c = cfg_py = cfg
        slow = rng.choice([0, 0, 700_000, 1_300_000])  # a slow model's results batch by time
        a = play("c", script, App(flaky_invoke=rng.choice([None, 2]), invoke_us=slow), cfg_c)
        b = play("python", script, App(flaky_invoke=a.flaky_invoke, invoke_us=slow), cfg_py)
        assert bytes(a.out) == bytes(b.out), f"trial {trial}"
        assert a.bauds == b.bauds, f"trial {trial}"
        assert keep_c == keep_py, f"trial {trial}"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc with AddressSanitizer")
def test_c_decoder_and_loop_under_sanitizers(tmp_path: Path) -> None:
    """Seeded hostile input (valid scripts, mutated, plus raw noise) through the C decoder and loop."""
    exe = tmp_path / "fuzz_loop"
    sources = [str(p) for p in sorted(COMMON.glob("esp_check_*.c"))]
    build = subprocess.run(
        ["gcc", "-std=c99", "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-Wall", "-Wextra", "-Werror", "-I", str(COMMON), str(COMMON.parent.parent / "tests/c/fuzz_loop.c"),
         *sources, "-o", str(exe)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"sanitizer runtime not available: {build.stderr[-200:]}")
    assert build.returncode == 0, build.stderr
    rng = random.Random(7)
    files = []
    for k in range(300):
        data = b"".join(_script(rng)) if k % 3 else rng.randbytes(rng.randrange(20000))
        if k % 5 == 0:
            data = bytearray(data)
            for _ in range(rng.randrange(1, 30)):
                if data:
                    data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        p = tmp_path / f"case{k}.bin"
        p.write_bytes(data)
        files.append(str(p))
    run = subprocess.run([str(exe), *files], capture_output=True, text=True, check=False, timeout=300)
    ok = run.returncode == 0 and "ERROR" not in run.stderr and run.stdout.startswith("ok")
    assert ok, run.stderr[-2000:]


# ---- the boot key and the HELLO line (docs/protocol.md "Boot key") -----------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_hello_is_one_printable_line_that_the_host_decodes_at_any_split(backend: str) -> None:
    app = play(backend, [])
    line = bytes(app.out)
    assert line.startswith(b"\r\n@ECH HELLO ") and line.endswith(b"\r\n") and line.count(b"\n") == 2
    assert all(0x20 <= c <= 0x7E for c in line.strip())  # a serial monitor shows one line of text
    for cut in range(len(line) + 1):
        dec = fr.FrameDecoder()
        items = dec.feed(line[:cut]) + dec.feed(line[cut:])
        hellos = [fr.decode_hello(f.payload) for f in items if isinstance(f, fr.Frame)]
        assert [(h.session, h.nn) for h in hellos] == [(SESSION, "optimized")], cut
        assert dec.key == KEY


@pytest.mark.parametrize("backend", BACKENDS)
def test_commands_of_another_boot_are_refused_by_the_device(backend: str) -> None:
    """A command keyed for another session (a host still talking to the previous boot) is a damaged
    frame to this boot: NAKed, never run."""
    app = App()
    stale = Script(key=fr.key_crc(SESSION ^ 1, "optimized")).run(0, source=fr.SRC_PRNG, seed=1)
    play(backend, stale.frames, app)
    frames, results, _ = responses(app)
    assert results == {} and app.invokes == 0
    assert [f.name for f in frames][:2] == ["HELLO", "NAK"]


def test_result_frames_of_an_earlier_boot_are_dropped_and_counted() -> None:
    """Two boots of the same firmware: the first boot's RESULT frame replayed after the second boot's
    HELLO (same seq, a valid CRC under the first boot's key) is never taken for the second boot's."""
    boots = []
    for session in (0x1111, 0x2222):
        cfg = config()
        cfg.session = session
        app = App()
        key = fr.key_crc(session, "optimized")
        play("python", Script(key=key).run(0, source=fr.SRC_PRNG, seed=session, results=fr.RES_CRC)
             .add(fr.CMD_SYNC, b"t").frames, app, cfg)  # fmt: skip
        boots.append(bytes(app.out))
    first, second = boots
    hello2_end = second.index(b"\r\n", 4) + 2
    first_result = next(f for f in fr.split_stream(first).frames if f.type == fr.RSP_RESULT)
    old_key = fr.key_crc(0x1111, "optimized")
    replay = fr.encode_frame(fr.RSP_RESULT, first_result.seq, first_result.payload, key=old_key)
    spliced = first + second[:hello2_end] + replay + second[hello2_end:]
    split = fr.split_stream(spliced)
    results = [fr.decode_results(f.payload, OUT_BYTES)[0] for f in split.frames if f.type == fr.RSP_RESULT]
    assert split.stats.stale == 1 and len(results) == 2  # one per boot: the replay was dropped
    assert replay not in split.text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [2, 11, 2304])
def test_full_results_cost_at_most_the_output_bytes_plus_16_per_input(backend: str, size: int) -> None:
    """The byte budget (docs/protocol.md "Result record"): a deterministic record with its outputs inline
    carries no CRC-32s and no id when it follows the previous one (9 bytes of header), and a device frame
    carries up to 16 KiB of records (7 of a 2,304-byte output), so device-to-host bytes per input stay
    within the output bytes + 16, every ACK and the SYNC_ACK included (the HELLO line is not per input)."""
    cfg = config()
    cfg.outputs = [LoopOutput(size, "int8", (1, size), 0.25, 0, "out")]
    app = App()

    def invoke(data: bytes) -> tuple[int, int, list[bytes]]:
        return 0, 1000, [(hashlib.sha256(data).digest() * (size // 32 + 1))[:size]]

    app.invoke = invoke  # type: ignore[method-assign]
    n = 100
    s = Script()
    for i in range(n):
        s.run(i, source=fr.SRC_PRNG, seed=5, results=fr.RES_FULL)
    play(backend, s.add(fr.CMD_SYNC, b"t").frames, app, cfg)
    split = fr.split_stream(bytes(app.out))
    recs = [r for f in split.frames if f.type == fr.RSP_RESULT for r in fr.decode_results(f.payload, [size])]
    assert sorted(r.ident for r in recs) == list(range(n))
    assert all(r.data is not None and r.crcs == (fr.crc32(r.data[0]),) for r in recs)
    hello = bytes(app.out).index(b"\r\n", 4) + 2  # the HELLO line is not per-input traffic
    per_input = (len(app.out) - hello) / n
    assert per_input <= size + 16, per_input


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [11, 2304])
def test_a_slow_models_full_results_share_frames_within_the_output_bytes_plus_16(
    backend: str, size: int
) -> None:
    """The same budget for a slow model (modelled: 0.95 s per invoke, U-Net 48 on an S3): the device keeps
    its results until the oldest waited frames.BATCH_WAIT_US of invokes, then sends them in one RESULT
    frame with the ACK folded in (version 3 sent a RESULT frame and an ACK frame per input: output + 45).
    Liveness: no result waits for more than that bound plus one invoke, and every RUN the device took is
    acknowledged."""
    cfg = config()
    cfg.outputs = [LoopOutput(size, "int8", (1, size), 0.25, 0, "out")]
    app = App()
    invoke_us = 950_000

    def invoke(data: bytes) -> tuple[int, int, list[bytes]]:
        return 0, invoke_us, [(hashlib.sha256(data).digest() * (size // 32 + 1))[:size]]

    app.invoke = invoke  # type: ignore[method-assign]
    n = 100
    s = Script()
    for i in range(n):
        s.run(i, source=fr.SRC_PRNG, seed=5, results=fr.RES_FULL)
    play(backend, s.frames, app, cfg)
    split = fr.split_stream(bytes(app.out), key=KEY)
    result_frames = [f for f in split.frames if f.type == fr.RSP_RESULT]
    recs = [r for f in result_frames for r in fr.decode_results(f.payload, [size])]
    assert sorted(r.ident for r in recs) == list(range(n))
    assert all(r.data is not None and r.crcs == (fr.crc32(r.data[0]),) for r in recs)
    per_frame = [len(fr.decode_results(f.payload, [size])) for f in result_frames]
    # the boot's first slow result goes at once (the host learns the invoke time); every later frame but
    # the stream's last shares 3+ results
    assert per_frame[0] == 1 and min(per_frame[1:-1]) >= 3, per_frame
    for f in result_frames:  # no result waits longer than the bound plus one RUN
        assert (
            sum(r.invoke_us for r in fr.decode_results(f.payload, [size])[1:]) < fr.BATCH_WAIT_US + invoke_us
        )
    acks = [fr.decode_ack(f.payload) if f.type == fr.RSP_ACK else f.ack for f in split.frames if _acks(f)]
    assert acks and acks[-1] == n and acks == sorted(acks)  # what the device took, acknowledged
    hello = bytes(app.out).index(b"\r\n", 4) + 2  # the HELLO line is not per-input traffic
    per_input = (len(app.out) - hello) / n
    assert per_input <= size + 16, per_input


# ---- kept inputs (docs/protocol.md "Kept inputs") ----------------------------------------------------


def _kept_boot(backend: str, region: bytearray, script: Script, *, nn: str = "optimized",
               sha: str = "ab" * 32, session: int = SESSION,
               place: int = 0x3D000000) -> tuple[App, fr.Hello]:  # fmt: skip
    """One boot of an app with the kept-input store ``region`` (the same memory across boots)."""
    cfg = dataclasses.replace(
        config(), keep=region, keep_place=place, nn=nn, model_sha256=sha, session=session
    )
    app = play(backend, script.frames, cfg=cfg)
    hello = next(
        fr.decode_hello(f.payload) for f in fr.split_stream(bytes(app.out)).frames if f.type == fr.RSP_HELLO
    )
    return app, hello


def _records(app: App, key: int) -> dict[int, fr.ResultRecord]:
    out: dict[int, fr.ResultRecord] = {}
    for f in fr.split_stream(bytes(app.out), key=key).frames:
        if f.type == fr.RSP_RESULT:
            out.update((r.ident, r) for r in fr.decode_results(f.payload, OUT_BYTES))
    return out


def _upload_then_run_kept(
    backend: str, data: list[bytes]
) -> tuple[tuple[App, fr.Hello], tuple[App, fr.Hello], dict[int, fr.ResultRecord]]:
    """The optimized app uploads and keeps ``data`` in a 4-input store; the ANSI C app, booted next on the
    same memory, is asked to run each from the store by its CRC-32. Both boots and the second's records."""
    region = bytearray(64 + 8 * 4 + 16 + 4 * 6912)
    first = Script()
    for i, d in enumerate(data):
        first.load(d).run(i, keep=True)
    one = _kept_boot(backend, region, first.add(fr.CMD_SYNC, b"t"))
    ansi_key = fr.key_crc(SESSION + 1, "ansi_c")
    second = Script(key=ansi_key)
    for i, d in enumerate(data):
        second.run(i, source=fr.SRC_KEPT, seed=fr.crc32(d))
    two = _kept_boot(backend, region, second.add(fr.CMD_SYNC, b"t"), nn="ansi_c", session=SESSION + 1)
    return one, two, _records(two[0], ansi_key)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kept_inputs_survive_the_restart_and_run_like_uploaded_ones(backend: str) -> None:
    """The optimized app keeps what it was sent; the ANSI C app, booted next on the same memory, runs
    them by index (no LOAD): the same input CRC-32 and outputs as an upload of the same bytes."""
    data = [random.Random(25).randbytes(6912) for _ in range(3)]
    (app, hello), (app2, hello2), kept = _upload_then_run_kept(backend, data)
    assert (hello.keep_capacity, hello.kept) == (4, 0)  # a fresh store (the region was zeros)
    uploaded = _records(app, KEY)
    assert (hello2.keep_capacity, hello2.kept) == (4, 3)
    assert app2.invokes == 3  # no LOAD was sent: every input ran from the store
    for i, d in enumerate(data):
        assert kept[i].status == fr.ST_OK and kept[i].input_crc == fr.crc32(d) == uploaded[i].input_crc
        assert kept[i].data == uploaded[i].data


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "damage", ["cold_boot", "other_model", "other_place", "flipped_byte", "other_dataset", "beyond"]
)
def test_a_store_that_is_not_this_models_inputs_is_never_run(backend: str, damage: str) -> None:
    """Noise (a cold boot), another model's store, a flipped byte in a kept input, a RUN naming another
    input's CRC-32, an index beyond the store: the device answers 'not kept' and runs nothing."""
    d = random.Random(3).randbytes(6912)
    region = bytearray(64 + 8 * 4 + 16 + 4 * 6912)
    _kept_boot(backend, region, Script().load(d).run(0, keep=True))
    ident, crc = 0, fr.crc32(d)
    if damage == "cold_boot":
        region[:] = random.Random(4).randbytes(len(region))
    elif damage == "flipped_byte":
        region[-4 * 6912 + 100] ^= 0x10  # inside kept input 0 (the inputs end the region)
    elif damage == "other_dataset":
        crc ^= 1
    elif damage == "beyond":
        ident = 9
    key = fr.key_crc(SESSION + 1, "ansi_c")
    sha = "cd" * 32 if damage == "other_model" else "ab" * 32
    place = 0x3D000040 if damage == "other_place" else 0x3D000000  # the other app linked it elsewhere
    app, hello = _kept_boot(backend, region, Script(key=key).run(ident, source=fr.SRC_KEPT, seed=crc),
                            nn="ansi_c", sha=sha, session=SESSION + 1, place=place)  # fmt: skip
    recs = _records(app, key)
    assert app.invokes == 0 and recs[ident].status == fr.ST_NOT_KEPT
    if damage in ("cold_boot", "other_model", "other_place"):
        assert hello.kept == 0  # the header failed its checks: an empty store replaced it


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_chunk_takes_the_entries_over_and_the_first_is_never_run_for_it(backend: str) -> None:
    """A dataset larger than the store runs in chunks of its capacity (docs/dataset.md): input i is kept in
    entry i % capacity, so the second chunk (ids 4..7 of a 4-input store) takes the entries of the first
    over. The next app runs the second chunk from the store; a RUN that names a first-chunk input (its
    CRC-32) finds another input in that entry and runs nothing ('not kept'), so the host uploads it."""
    rng = random.Random(26)
    data = [rng.randbytes(6912) for _ in range(8)]
    _, (app, hello), recs = _upload_then_run_kept(backend, data)
    assert (hello.keep_capacity, hello.kept) == (4, 4)
    assert app.invokes == 4  # the second chunk only
    for i, d in enumerate(data):
        if i < 4:
            assert recs[i].status == fr.ST_NOT_KEPT  # its entry holds input i + 4 now
        else:
            assert recs[i].status == fr.ST_OK and recs[i].input_crc == fr.crc32(d)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("window", "invoke_us"), [(16384, 170_000), (65536, 170_000), (65536, 950_000)])
def test_uploaded_inputs_pay_an_ack_per_half_window(backend: str, window: int, invoke_us: int) -> None:
    """U-Net 48's 6,912-byte inputs uploaded (LOAD frames, then RUN), its 2,304-byte output in full, the
    host keeping the device's queue full (no pause: no idle flush): the device sends an ACK frame per
    window / 2 bytes taken in, unless a result frame carries it. The 16 KiB window of a board without
    PSRAM costs ~15 bytes of ACKs per input, over the output + 16 goal; the 64 KiB window of a board
    with PSRAM stays within it, at ESP-NN's invoke time (0.17 s) and ANSI C's (0.95 s) alike."""
    size, n = 2304, 100
    cfg = config(window)
    cfg.outputs = [LoopOutput(size, "int8", (1, size), 0.25, 0, "out")]
    app = App()

    def invoke(data: bytes) -> tuple[int, int, list[bytes]]:
        return 0, invoke_us, [(hashlib.sha256(data).digest() * (size // 32 + 1))[:size]]

    app.invoke = invoke  # type: ignore[method-assign]
    rng = random.Random(48)
    s = Script()
    for i in range(n):
        s.load(rng.randbytes(6912)).run(i, results=fr.RES_FULL)
    play(backend, s.add(fr.CMD_SYNC, b"t").frames, app, cfg)
    split = fr.split_stream(bytes(app.out), key=KEY)
    recs = [r for f in split.frames if f.type == fr.RSP_RESULT for r in fr.decode_results(f.payload, [size])]
    assert sorted(r.ident for r in recs) == list(range(n)) and all(r.status == fr.ST_OK for r in recs)
    ack_frames = sum(f.type == fr.RSP_ACK for f in split.frames)
    taken = sum(len(f) for f in s.frames)
    assert ack_frames <= taken // (window // 2) + 1
    hello = bytes(app.out).index(b"\r\n", 4) + 2  # the HELLO line is not per-input traffic
    per_input = (len(app.out) - hello) / n
    assert (per_input <= size + 16) == (window == 65536), per_input


@pytest.mark.skipif(not HAVE_CC, reason="no host C compiler")
def test_the_c_loop_and_its_emitter_call_one_library_handle() -> None:
    """make_loop loads the protocol library once: the C loop and the C emitter it prints through call the
    same handle (the loop owns it), with the emitter's and the loop's signatures both set on it."""
    import ctypes  # the handle's declared types

    loop = make_loop(config(), App(), backend="c")
    assert isinstance(loop, CDeviceLoop)
    assert loop.emitter.lib is loop.lib
    assert loop.lib.ecp_sizeof.restype is ctypes.c_size_t and loop.lib.ecl_sizeof.restype is ctypes.c_size_t
