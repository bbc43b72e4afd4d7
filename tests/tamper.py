"""A byte-level man in the middle between esp-check and ``esp-check sim serve --rfc2217`` (tests, bench).

RFC 2217 is telnet: :class:`TamperProxy` splits each direction into telnet commands (forwarded untouched,
so baud rates and resets still work) and data bytes (0xFF escaped as 0xFF 0xFF), hands the data to a
:class:`Tamper`, and escapes what it returns. A tamper acts only once the resident loop runs (after the
first ``@ECH HELLO`` line), so esptool's flashing is never touched: what is tested is what esp-check makes
of a damaged, replayed or forged resident-loop stream. Each tamper is seeded and applies one event (the
forgeries: to every HELLO).

Kinds (device to host unless named ``tx_``):

- ``flip`` / ``drop`` / ``dup`` / ``insert``: a flipped bit, bytes dropped, a run repeated, noise inserted;
- ``reorder``: two complete frames of one chunk swapped;
- ``replay``: after the second boot's HELLO, a RESULT frame is replaced by a RESULT frame of the first
  boot, renumbered to the replaced frame's seq and given a valid CRC under the first boot's key (stale
  bytes of another boot, as a UART FIFO or a USB buffer keeps them across a reset);
- ``replay_hello``: as ``replay``, with the first boot's HELLO line (unkeyed: valid as it was) just
  before the replayed RESULT frame, as if that boot were back;
- ``forge_hello``: every HELLO's model SHA-256 rewritten to zeros (a valid HELLO frame again);
- ``forge_nn``: every HELLO's ESP-NN mode rewritten to the other variant's;
- ``tx_flip`` / ``tx_drop``: a command frame damaged or dropped on its way to the device.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from dataclasses import dataclass, field

from harness.flows.job import JobOptions
from harness.protocol import frames as fr

IAC, SB, SE = 255, 250, 240
KINDS = (
    "flip",
    "drop",
    "dup",
    "insert",
    "reorder",
    "replay",
    "replay_hello",
    "forge_hello",
    "forge_nn",
    "tx_flip",
    "tx_drop",
)


class TelnetSplit:
    """Telnet stream -> (is_data, bytes) pieces in order (state kept across chunks)."""

    def __init__(self) -> None:
        self.state = "data"
        self.cmd = bytearray()

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        if self.state == "data" and IAC not in data:
            return [(True, data)] if data else []
        out: list[tuple[bool, bytes]] = []
        buf = bytearray()
        for b in data:
            st = self.state
            if st == "data":
                if b == IAC:
                    self.state = "iac"
                else:
                    buf.append(b)
            elif st == "iac":
                if b == IAC:
                    buf.append(IAC)
                    self.state = "data"
                    continue
                if buf:
                    out.append((True, bytes(buf)))
                    buf = bytearray()
                self.cmd = bytearray([IAC, b])
                if b == SB:
                    self.state = "sb"
                elif 251 <= b <= 254:
                    self.state = "opt"
                else:
                    out.append((False, bytes(self.cmd)))
                    self.state = "data"
            elif st == "opt":
                self.cmd.append(b)
                out.append((False, bytes(self.cmd)))
                self.state = "data"
            elif st == "sb":
                self.cmd.append(b)
                self.state = "sb_iac" if b == IAC else "sb"
            else:  # sb_iac
                self.cmd.append(b)
                if b == SE:
                    out.append((False, bytes(self.cmd)))
                    self.state = "data"
                else:
                    self.state = "sb"
        if buf:
            out.append((True, bytes(buf)))
        return out


def _frames_in(chunk: bytes) -> list[tuple[int, int]]:
    """(start, end) of every complete frame-shaped run in ``chunk`` (header checks only, no CRC)."""
    spans = []
    pos = chunk.find(fr.MAGIC)
    while 0 <= pos <= len(chunk) - fr.HEADER:
        n, nx = struct.unpack_from("<HH", chunk, pos + 6)
        end = pos + fr.HEADER + n + fr.TRAILER
        if n + nx == 0xFFFF and end <= len(chunk):
            spans.append((pos, end))
            pos = chunk.find(fr.MAGIC, end)
        else:
            pos = chunk.find(fr.MAGIC, pos + 1)
    return spans


def _whole(data: bytes) -> int:
    """How much of ``data`` can go on: all but a trailing partial frame or partial HELLO line."""
    cut = len(data)
    pos = data.rfind(fr.MAGIC, max(0, len(data) - fr.MAX_FRAME))
    while pos >= 0:
        if len(data) - pos < fr.HEADER:
            cut = pos
        else:
            n, nx = struct.unpack_from("<HH", data, pos + 6)
            if n + nx == 0xFFFF and pos + fr.HEADER + n + fr.TRAILER > len(data):
                cut = pos
        pos = data.rfind(fr.MAGIC, max(0, len(data) - fr.MAX_FRAME), pos)
    at = data.rfind(b"@ECH")
    if at >= 0 and data.find(b"\n", at) < 0:
        cut = min(cut, at)
    for k in range(1, 4):  # "@", "@E", "@EC" at the very end
        if data.endswith(b"@ECH"[:k]):
            cut = min(cut, len(data) - k)
    return cut


def _hello_lines(chunk: bytes) -> list[tuple[int, int, fr.Hello, bytes]]:
    """(start, end, hello, frame) of every complete HELLO line in ``chunk``."""
    out = []
    pos = chunk.find(fr.HELLO_LINE)
    while pos >= 0:
        end = chunk.find(b"\n", pos)
        if end < 0:
            break
        f = fr.hello_from_line(chunk[pos + len(fr.HELLO_LINE) : end])  # esp-check's own line reader
        if f is not None:
            with contextlib.suppress(fr.FrameFormatError):
                frame = fr.encode_frame(f.type, f.seq, f.payload, f.flags)  # HELLO is unkeyed: the same bytes
                out.append((pos, end + 1, fr.decode_hello(f.payload), frame))
        pos = chunk.find(fr.HELLO_LINE, end)
    return out


@dataclass
class Tamper:
    """One seeded tamper event of ``kind``, at the ``when``-th chance after the resident loop started."""

    kind: str
    seed: int
    when: int = 0
    applied: int = 0
    rng: random.Random = field(init=False)
    hellos: list[fr.Hello] = field(default_factory=list)
    results: dict[int, list[bytes]] = field(default_factory=dict)  # session -> its RESULT payloads
    chances: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(f"tamper:{self.kind}:{self.seed}")
        if self.when == 0:
            self.when = self.rng.randint(1, 4)

    def _chance(self) -> bool:
        if self.applied:
            return False
        self.chances += 1
        if self.chances < self.when:
            return False
        self.applied += 1
        return True

    # ---- device -> host ---------------------------------------------------------------------------

    def device_to_host(self, chunk: bytes) -> bytes:
        lines = _hello_lines(chunk)
        if self.kind in ("forge_hello", "forge_nn"):  # every HELLO: the one esp-check acts on among them
            for line in reversed(lines):
                chunk = self._forge(chunk, line)
            return chunk
        for _s, _e, hello, _f in lines:
            if not self.hellos or hello.session != self.hellos[-1].session:
                self.hellos.append(hello)
        if not self.hellos:
            return chunk
        spans = _frames_in(chunk)
        if self.kind in ("replay", "replay_hello"):
            return self._replay(chunk, spans)
        if self.kind == "reorder":
            if len(spans) >= 2 and self._chance():
                (a0, a1), (b0, b1) = spans[0], spans[1]
                return chunk[:a0] + chunk[b0:b1] + chunk[a1:b0] + chunk[a0:a1] + chunk[b1:]
            return chunk
        if self.kind in ("flip", "drop", "dup", "insert") and len(chunk) > 2 and self._chance():
            return self._bytes(chunk)
        return chunk

    def _bytes(self, chunk: bytes) -> bytes:
        rng = self.rng
        at = rng.randrange(len(chunk))
        if self.kind == "flip":
            b = bytearray(chunk)
            b[at] ^= 1 << rng.randrange(8)
            return bytes(b)
        k = rng.randint(1, 64)
        if self.kind == "drop":
            return chunk[:at] + chunk[at + k :]
        if self.kind == "dup":
            return chunk[: at + k] + chunk[at : at + k] + chunk[at + k :]
        return chunk[:at] + rng.randbytes(rng.randint(1, 32)) + chunk[at:]

    def _replay(self, chunk: bytes, spans: list[tuple[int, int]]) -> bytes:
        """Replace this boot's RESULT frame by an earlier boot's (same seq, CRC under that boot's key)."""
        now = self.hellos[-1]
        earlier = [(h, self.results[h.session]) for h in self.hellos[:-1] if self.results.get(h.session)]
        out = chunk
        for s, e in reversed(spans):
            if chunk[s + 2] != fr.RSP_RESULT:
                continue
            self.results.setdefault(now.session, []).append(chunk[s + fr.HEADER : e - fr.TRAILER])
            if earlier and self._chance():
                seq = struct.unpack_from("<H", chunk, s + 4)[0]
                hello, payloads = self.rng.choice(earlier)
                stale = fr.encode_frame(fr.RSP_RESULT, seq, self.rng.choice(payloads), key=hello.key)
                if self.kind == "replay_hello":
                    stale = fr.hello_line(fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(hello))) + stale
                out = out[:s] + stale + out[e:]
        return out

    def _forge(self, chunk: bytes, line: tuple[int, int, fr.Hello, bytes]) -> bytes:
        s, e, hello, frame = line
        payload = bytearray(frame[fr.HEADER : -fr.TRAILER])
        if self.kind == "forge_hello":
            payload[24:56] = bytes(32)
        else:
            payload[2] = fr.NN_CODES["ansi_c" if hello.nn == "optimized" else "optimized"]
        self.applied += 1
        seq = struct.unpack_from("<H", frame, 4)[0]  # the HELLO stays a valid frame: CRC recomputed
        forged = fr.hello_line(fr.encode_frame(fr.RSP_HELLO, seq, bytes(payload)))[2:]
        return chunk[:s] + forged + chunk[e:]

    # ---- host -> device ---------------------------------------------------------------------------

    def host_to_device(self, chunk: bytes) -> bytes:
        if not self.kind.startswith("tx_") or not self.hellos:
            return chunk
        spans = [(s, e) for s, e in _frames_in(chunk) if chunk[s + 2] in (fr.CMD_LOAD, fr.CMD_RUN)]
        if not spans or not self._chance():
            return chunk
        s, e = self.rng.choice(spans)
        if self.kind == "tx_drop":
            return chunk[:s] + chunk[e:]
        b = bytearray(chunk)
        b[self.rng.randrange(s + 2, e)] ^= 1 << self.rng.randrange(8)
        return bytes(b)


class TamperProxy:
    """TCP proxy in front of an RFC 2217 server; every connection gets the same :class:`Tamper`."""

    def __init__(self, upstream: tuple[str, int], tamper: Tamper) -> None:
        self.upstream, self.tamper = upstream, tamper
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()  # one direction's tamper call at a time
        self.threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True, name="tamper-accept")
        t.start()
        self.threads.append(t)

    @property
    def address(self) -> str:
        return f"rfc2217://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop_flag.is_set():
            try:
                client, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(self.upstream)
            for src, dst, down in ((server, client, True), (client, server, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, down), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        """Forward ``src`` to ``dst``; data passes the tamper in pieces that end on frame and line
        boundaries (a partial frame or HELLO line waits for its rest, at most 50 ms of silence)."""
        split = TelnetSplit()
        pending = bytearray()
        tamper = self.tamper.device_to_host if down else self.tamper.host_to_device

        def release(upto: int) -> bytes:
            piece = bytes(pending[:upto])
            del pending[:upto]
            if not piece:
                return b""
            with self.lock:
                piece = tamper(piece)
            return piece.replace(b"\xff", b"\xff\xff")

        src.settimeout(0.05)
        try:
            while not self.stop_flag.is_set():
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    if pending:
                        dst.sendall(release(len(pending)))
                    continue
                if not data:
                    break
                out = bytearray()
                for is_data, piece in split.feed(data):
                    if is_data:
                        pending += piece
                        out += release(_whole(bytes(pending)))
                    else:
                        out += release(len(pending)) + piece
                dst.sendall(bytes(out))
            if pending:
                dst.sendall(release(len(pending)))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.stop_flag.set()
        with contextlib.suppress(OSError):
            self.sock.close()


# ---- trials: one flash-and-compare through the proxy, and what its exit code may be ----------------

BOARDS = {"clean": "", "corrupt": "&fault=corrupt&variant_fault=optimized"}


def allowed_exits(kind: str, board: str) -> set[int]:
    """The exit codes a tampered run may honestly end with. A clean board may match (the damage was
    repaired or hit only text) or end on the link; a corrupt board is never a match. A forged model hash
    is refused (2); a forged ESP-NN mode leaves the variants unreachable (2 or 3)."""
    if kind == "forge_hello":
        return {2}
    if kind == "forge_nn":
        return {2, 3}
    return {0, 3} if board == "clean" else {1, 3}


def _dataset_options(seed: int) -> JobOptions:
    """A trial's job: 10 random inputs drawn by the device, CRC mode."""
    from harness.flows.dataset import DatasetOptions
    from harness.flows.records import StageTimeouts

    return JobOptions(
        dataset=DatasetOptions(random_inputs=10, seed=seed, results="crc"),
        timeouts=StageTimeouts(capture_total=30, capture_silence=2),
    )


def _flash_in_process(url: str, model: str, seed: int) -> None:
    """The trials' firmware written onto the board through its in-process ``sim://`` port (one untampered
    run, about a second) before the board is served: a trial's HELLO probe then finds it there and skips
    esptool, as on every later trial, instead of the first trial on each board paying a whole esptool
    session over RFC 2217 (connect, stub, flash id, every region's checksum: about 35 s with pyserial's
    own client, which renegotiates the link on each timeout change). Trials whose tamper makes the probe
    flash (a forged HELLO) still run esptool through the proxy."""
    import tempfile
    from pathlib import Path

    from harness.flows.flash_and_compare import flash_and_compare

    with tempfile.TemporaryDirectory(prefix="tamper-flash-") as out:
        flash_and_compare(
            Path(model), [], board="sim", port=url, out_dir=Path(out), options=_dataset_options(seed)
        )


@dataclass
class Servers:
    """One served simulated board per board kind (``sim serve --rfc2217`` in this process); with ``model``,
    the board holds that model's trial firmware before it is served (:func:`_flash_in_process`)."""

    servers: dict[str, object] = field(default_factory=dict)

    def port(self, board: str, model: str = "", seed: int = 0) -> int:
        if board not in self.servers:
            import uuid

            from harness.sim.serve import serve_rfc2217

            url = f"sim://tamper-{board}-{uuid.uuid4().hex[:6]}?chip=esp32s3&emitter=c&flash_size=8MB{BOARDS[board]}"
            if model:
                _flash_in_process(url, model, seed)
            self.servers[board] = serve_rfc2217(url)
        return int(self.servers[board].port)  # type: ignore[attr-defined]

    def close(self) -> None:
        for s in self.servers.values():
            s.stop()  # type: ignore[attr-defined]
        self.servers.clear()


@dataclass(frozen=True)
class Trial:
    kind: str
    board: str
    seed: int
    code: int
    applied: int
    stale_frames: int
    detail: str

    @property
    def false_match(self) -> bool:
        return self.code == 0 and self.board != "clean"

    @property
    def wrong_class(self) -> bool:
        return self.code not in allowed_exits(self.kind, self.board)


def run_trial(servers: Servers, kind: str, board: str, seed: int, model: str, out: str) -> Trial:
    """One dataset run (10 random inputs, CRC mode) of ``model`` through a proxy applying ``kind``."""
    import json
    from pathlib import Path

    from harness.errors import EspCheckError
    from harness.flows.flash_and_compare import flash_and_compare

    tamper = Tamper(kind, seed)
    proxy = TamperProxy(("127.0.0.1", servers.port(board, model, seed)), tamper)
    stale, detail = 0, ""
    try:
        res = flash_and_compare(
            Path(model),
            [],
            board="sim",
            port=proxy.address,
            out_dir=Path(out),
            options=_dataset_options(seed),
        )
        code, detail = int(res.exit_code), "; ".join(res.errors[:2])
        link = json.loads(res.report_path.read_text()).get("dataset", {}).get("link", {})
        stale = sum(int(v.get("stale_frames", 0)) for v in link.values())
    except EspCheckError as exc:
        code, detail = int(exc.exit_code), str(exc)
    finally:
        proxy.close()
    return Trial(kind, board, seed, code, tamper.applied, stale, detail)


def fuzz_trial(seed: int, k: int, workdir: str, servers: Servers) -> dict[str, object]:
    """Trial ``k`` of a long run (bench/fuzz.py --frames): kind, board and tamper seed drawn from
    (seed, k). ``false_match`` is set for a false match *or* an exit code of the wrong class."""
    import os

    rng = random.Random(f"{seed}:frames:{k}")
    kind, board = rng.choice(KINDS), rng.choice(sorted(BOARDS))
    model = os.path.join(os.path.dirname(__file__), "data", "models", "cnn_classifier_11.tflite")
    t = run_trial(servers, kind, board, rng.randrange(1 << 30), model, os.path.join(workdir, f"t{k}"))
    bad = "false match" if t.false_match else ("wrong exit class" if t.wrong_class else "")
    return {
        "mutation": f"{board}:{kind} applied={t.applied} stale={t.stale_frames}",
        "code": t.code,
        "false_match": bool(bad),
        "contained_crash": False,
        "detail": f"{bad}: {t.detail}" if bad else t.detail,
    }
