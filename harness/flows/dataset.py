"""``flash-and-compare --dataset`` / ``--random-inputs``: many inputs through the resident firmware.

How the stream runs and what every result is checked against before it counts: docs/dataset.md
and docs/protocol.md "Resident loop".
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.classify import Finding, Severity, classify
from harness.analysis.dataset import DatasetAnalysis, Leg, OutputSpec, analyze, host_leg
from harness.device.loop import DeviceRestarted, LinkError, LinkLost, LinkStats, LoopClient
from harness.errors import ExitCode, UsageError
from harness.firmware.backtrace import decode_findings
from harness.flashfmt.partitions import VARIANTS
from harness.flows.capture import boot_variant, link_verdict
from harness.flows.records import Recorder, VariantRun
from harness.flows.resident import Boot, ResidentBoard
from harness.manifest import VARIANT_OF_NN
from harness.model import reference
from harness.model.dataset import Dataset, load_dataset, random_dataset
from harness.model.inputs import InputOptions
from harness.model.loader import ModelInfo, TensorInfo
from harness.protocol import frames
from harness.protocol.spec import crc32

RESET_CHECK_INPUTS = 16
MAX_PASSES = 4  # a dataset pass and up to three re-runs of the inputs whose results were lost


@dataclasses.dataclass
class DatasetRun:
    """What the board returned for the dataset, per variant, and how the link fared."""

    legs: dict[str, list[Leg]]
    link: dict[str, LinkStats] = dataclasses.field(default_factory=dict)
    passes: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    after_reset: dict[str, Any] | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    codes: list[ExitCode] = dataclasses.field(default_factory=list)
    kept: set[int] = dataclasses.field(default_factory=set)  # inputs the device's kept-input store holds
    chunks: dict[str, Any] = dataclasses.field(default_factory=dict)  # _Chunks.summary(): parts, why


class _Collector:
    """RESULT and DATA frames -> one record per input, with its full outputs when they came."""

    def __init__(self, output_bytes: Sequence[int]) -> None:
        self.sizes = list(output_bytes)
        self.records: dict[int, frames.ResultRecord] = {}
        self.device_errors: list[frames.DeviceError] = []
        self.problems: list[str] = []
        self.payload = 0

    def take(self, client: LoopClient) -> None:
        while client.inbox:
            f = client.inbox.popleft()
            try:
                self._frame(f)
            except frames.FrameFormatError as exc:
                self.problems.append(f"{f.name} frame {f.seq}: {exc}")

    def _frame(self, frame: frames.Frame) -> None:
        if frame.type == frames.RSP_RESULT:
            for rec in frames.decode_results(frame.payload, self.sizes):
                if rec.data is not None:
                    self.payload += sum(len(d) for d in rec.data)
                self.records[rec.ident] = rec
        elif frame.type == frames.RSP_DATA:
            chunk = frames.decode_data(frame.payload)
            got = self.records.get(chunk.ident)
            if got is None or not got.wants_data_frames or chunk.output >= len(self.sizes):
                raise frames.FrameFormatError(f"DATA for input {chunk.ident} that announced none")
            buf = got.pending.setdefault(chunk.output, bytearray())
            if chunk.offset != len(buf) or len(buf) + len(chunk.data) > self.sizes[chunk.output]:
                raise frames.FrameFormatError(
                    f"DATA for input {chunk.ident} output {chunk.output} out of order"
                )
            buf += chunk.data
            self.payload += len(chunk.data)
        elif frame.type == frames.RSP_ERROR:
            self.device_errors.append(frames.decode_error(frame.payload))

    def leg(self, i: int, data: bytes, outputs: Sequence[OutputSpec]) -> Leg:
        """The checked result of input ``i`` (``data``: the input bytes the host meant)."""
        rec = self.records.get(i)
        if rec is None:
            return Leg("missing", detail="no result came back")
        if rec.status == frames.ST_INVOKE_FAILED:
            return Leg("invoke_failed", detail=f"Invoke returned status {rec.invoke_us}")
        if rec.status == frames.ST_NOT_KEPT:
            return Leg("invalid", detail="the device held no valid kept copy of this input")
        if rec.status != frames.ST_OK:
            return Leg("invalid", detail=f"status {rec.status} (the input did not arrive whole)")
        if rec.input_crc != crc32(data):
            return Leg("invalid", detail="the device ran other input bytes than the host sent or drew")
        raw = rec.data
        if rec.wants_data_frames:
            if any(len(rec.pending.get(o, b"")) != n for o, n in enumerate(self.sizes)):
                return Leg("missing", detail="its outputs' DATA frames did not all come back")
            raw = [bytes(rec.pending[o]) for o in range(len(self.sizes))]
        arrays = None
        if raw is not None and rec.nondeterministic and list(map(crc32, raw)) != list(rec.crcs):
            raw = None  # the last repeat's outputs, not the first's: the record's CRC-32s stand alone
        if raw is not None:
            if list(map(crc32, raw)) != list(rec.crcs):
                return Leg("invalid", detail="its outputs do not have the CRC-32s it reported")
            arrays = [
                np.frombuffer(b, np.dtype(o.dtype).newbyteorder("<")).reshape(o.shape)
                for b, o in zip(raw, outputs, strict=True)
            ]
        return Leg("ok", rec.crcs, arrays, rec.nondeterministic, rec.invoke_us)


@dataclasses.dataclass(frozen=True)
class _Ask:
    """What every RUN of one stream asks: ``results`` (a ``frames.RES_*`` mode), ``repeat``, the CRC-32s
    ``expected`` per input; ``now``: every result comes back at once, not batched (a re-run after lost
    results: a device that hangs on one input loses only that input's result); ``keep``: the uploaded
    inputs to store (the chunk being kept, docs/dataset.md "Datasets larger than the store"); None: those
    below the store's capacity."""

    results: int
    repeat: int = 1
    expected: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    now: bool = False
    keep: frozenset[int] | None = None


def _stream(
    ctx: _Streams, boot: Boot, ids: Sequence[int], log_path: Path, ask: _Ask, *, kept: set[int] | None = None
) -> _Streamed:
    """Run ``ids`` of the dataset on the booted app as ``ask`` says: their checked legs, the link's
    figures, problems and the firmware faults the device printed. ``kept``: the inputs an earlier variant
    of this check left in the device's kept-input store (updated with what this stream stores); None:
    upload every input."""
    assert boot.hello is not None
    hello, resident, dataset = boot.hello, ctx.resident, ctx.dataset
    problems: list[str] = []
    with open(log_path, "ab") as log:
        client = resident.client(boot, log)
        col = _Collector(hello.output_bytes)
        sender = _Sender(client, col, dataset, kept, ask)
        try:
            sender.send(ids)
            client.sync(len(ids))
            col.take(client)
            again = [i for i in ids if i in col.records and col.records[i].status == frames.ST_NOT_KEPT]
            if again:  # not kept after all (a cold boot, another model's store, a damaged copy): upload them
                client.stats.kept_fallbacks += len(again)
                sender.send(again, upload=True)
                client.sync(len(ids) + 1)
        except DeviceRestarted as exc:
            resident.current = None
            problems.append(f"the {hello.nn} app restarted in the middle of the dataset: {exc}")
        except LinkError as exc:
            resident.current, resident.lost = None, isinstance(exc, LinkLost)
            problems.append(str(exc))
        col.take(client)
    boot.next_seq = client.seq
    sender.note_kept()
    client.stats.rx_payload += col.payload
    client.stats.results += len(col.records)
    resident.link.add(client.stats)  # the run's total (report.json "link")
    problems += col.problems + [f"device ERROR {e.stage}: {e.msg}" for e in col.device_errors]
    legs = {i: col.leg(i, dataset.items[i].data, ctx.outputs) for i in ids}
    faults = _crashes(resident, hello.nn, bytes(client.raw))
    if faults:  # the device crashed: the input it was running has no result, and that is the finding
        why = "; ".join(f.message for f in faults)
        crashed = next((i for i in ids if legs[i].status == "missing"), None)
        if crashed is not None:
            legs[crashed] = Leg(
                "invoke_failed", detail=f"the device crashed while it ran (or sent) this input: {why}"
            )
    return _Streamed(legs, client.stats, problems, faults)


class _Sender:
    """The RUN commands of a stream: random inputs drawn by the device; an input an earlier variant left
    in the kept-input store run from there by index (its CRC-32 in the RUN: the device refuses any other
    bytes, and the result's input CRC-32 proves what ran); every other input uploaded (and kept, when the
    store has room, for the variants after this one)."""

    def __init__(
        self, client: LoopClient, col: _Collector, dataset: Dataset, kept: set[int] | None, ask: _Ask
    ) -> None:
        self.client, self.col, self.ds, self.kept, self.ask = client, col, dataset, kept, ask
        hello = client.hello
        self.capacity = hello.keep_capacity if kept is not None and not dataset.random else 0
        # the device stores input i in entry i % capacity: a chunk of at most `capacity` consecutive inputs
        self.keep_ids = frozenset(range(self.capacity)) if ask.keep is None else ask.keep
        self.usable = hello.kept > 0  # this boot found kept inputs (none: a cold boot, another model ...)
        self.stored: list[int] = []

    def send(self, ids: Sequence[int], *, upload: bool = False) -> None:
        client, ds, ask = self.client, self.ds, self.ask
        for i in ids:
            exp = ask.expected.get(i, ())
            mode = ask.results if (ask.results != frames.RES_FULL_IF_DIFFERENT or exp) else frames.RES_CRC
            common: dict[str, Any] = {"results": mode, "repeat": ask.repeat, "expected": exp, "now": ask.now}
            if ds.random:
                run = frames.encode_run(i, source=frames.SRC_PRNG, seed=ds.seed or 0, **common)
            elif not upload and self.usable and self.kept is not None and i in self.kept:
                run = frames.encode_run(i, source=frames.SRC_KEPT, seed=crc32(ds.items[i].data), **common)
                client.stats.kept_runs += 1
            else:
                client.load(ds.items[i].data)
                keep = self.capacity > 0 and i in self.keep_ids
                run = frames.encode_run(i, keep=keep, **common)
                if keep:
                    self.stored.append(i)
            client.send(frames.CMD_RUN, run)
            self.col.take(client)

    def note_kept(self) -> None:
        """The inputs this stream stored (the device answered for them: the RUN was taken)."""
        if self.kept is None:
            return
        recs = self.col.records
        taken = {i % self.capacity for i in self.stored}  # whatever held these entries before is gone
        self.kept.difference_update([j for j in self.kept if j % self.capacity in taken])
        self.kept.update(i for i in self.stored if i in recs and recs[i].status != frames.ST_INPUT_INCOMPLETE)


@dataclasses.dataclass
class _Streamed:
    legs: dict[int, Leg]
    stats: LinkStats
    problems: list[str]
    faults: list[Finding]  # firmware faults in what the device printed while it streamed


def _record(out: DatasetRun, run: VariantRun, streamed: _Streamed) -> None:
    """A stream's link figures join its variant's; a crash is its finding (exit 4), never a link hiccup to
    retry, also in a fetch or the after-reset check, whose crashes no per-input verdict sees."""
    out.link.setdefault(run.variant, LinkStats()).add(streamed.stats)
    if faults := streamed.faults:
        run.findings += [f.to_dict() for f in faults]
        out.codes.append(ExitCode.FIRMWARE_FAULT)
        out.errors.append(f"{run.variant}: firmware fault while streaming the dataset: {faults[0].message}")


def _crashes(resident: ResidentBoard, variant: str, raw: bytes) -> list[Finding]:
    """Firmware faults (a panic, an abort, a watchdog reset, a TFLM error) in what the device printed
    while it streamed, classified like a single run's capture and decoded with the variant's ELF."""
    found = [f for f in classify(raw) if f.severity == Severity.FIRMWARE_FAULT]
    build = resident.builds.get(VARIANT_OF_NN.get(variant, ""))
    return decode_findings(found, build.elf, build.chip) if found and build is not None else found


def _second_result(first: Leg, again: Leg) -> Leg:
    """An input run again keeps what the first result proved (docs/dataset.md: a second result that
    differs is non-deterministic and never replaces the first)."""
    if not (first.ok and again.ok) or first.crcs is None or again.crcs is None:
        return again if again.ok or not first.ok else first
    if first.crcs == again.crcs:
        return again
    hexes = [" ".join(f"{c:08X}" for c in x) for x in (first.crcs, again.crcs)]
    return Leg(
        "ok", first.crcs, None, True, first.invoke_us,
        f"run again, the same input gave other outputs (CRC-32 {hexes[0]}, then {hexes[1]}): the "
        "device is not deterministic on it, or a result was altered on the link",
    )  # fmt: skip


_TRANSIENT = ("missing", "invalid")  # lost or damaged on the way: worth running again


@dataclasses.dataclass
class _Streams:
    """What every stream of one dataset run reads (the board, the variants' runs, the dataset and its
    outputs) and where the results go (``out``)."""

    resident: ResidentBoard
    runs: Mapping[str, VariantRun]
    dataset: Dataset
    outputs: Sequence[OutputSpec]
    out: DatasetRun


def run_dataset(
    resident: ResidentBoard,
    runs: Mapping[str, VariantRun],
    order: Sequence[str],
    dataset: Dataset,
    outputs: Sequence[OutputSpec],
    opts: DatasetOptions,
    *,
    host: Sequence[Leg] | None,
) -> DatasetRun:
    """Every variant in ``order`` over the whole dataset (with retries, fetches and the reset check): in one
    part, or in chunks of the kept-input store's capacity (``_Chunks``)."""
    n = len(dataset.items)
    out = DatasetRun({v: [Leg("missing", detail="not run") for _ in range(n)] for v in runs})
    mode = frames.RES_FULL if opts.results == "full" else frames.RES_FULL_IF_DIFFERENT
    done: list[str] = []
    dead: set[str] = set()
    plan = _Chunks(n, opts.chunks, random=dataset.random, variants=len(order))
    ctx = _Streams(resident, runs, dataset, outputs, out)
    while (turn := plan.next_turn(list(order), resident)) is not None:
        for v in [v for v in turn if v not in dead]:
            t0 = time.monotonic()
            boot = boot_variant(resident, runs[v])
            if not isinstance(boot, Boot):
                out.errors.append(f"{v}: the app did not start: see {runs[v].serial_log}")
                out.codes.append(boot or ExitCode.INFRASTRUCTURE)
                dead.add(v)
                continue
            assert boot.hello is not None
            ids, keep = plan.part(boot.hello)
            plan.booted(v, time.monotonic() - t0)
            expected = (
                _expected(host, [out.legs[d] for d in done]) if mode == frames.RES_FULL_IF_DIFFERENT else {}
            )
            _passes(ctx, boot, runs[v], ids, _Ask(mode, opts.repeat, expected, keep=keep))
            plan.ran(v, [out.legs[v][i].invoke_us for i in ids])
            done += [] if v in done else [v]
        if not plan.advance(boot_rate(resident)):
            break
    out.chunks = plan.summary()
    if mode == frames.RES_FULL_IF_DIFFERENT:
        _fetch(ctx, list(reversed(done)), host)
    if opts.repeat >= 2 and done:
        out.after_reset = _after_reset(ctx, done[-1])
    return out


def boot_rate(resident: ResidentBoard) -> float:
    """Bytes per second of the resident link as it runs now (10 bits per byte at the current boot's baud,
    else the console's); 0.0: a link without a baud (native pipe, USB-Serial-JTAG)."""
    if not resident.uart_link:
        return 0.0
    baud = resident.current.link_baud if resident.current is not None else 0
    return (baud or resident.dev.console_baud) / 10.0


def upload_bytes(input_bytes: int) -> int:
    """What an uploaded input puts on the link: its LOAD frames (header, offset, CRC-32 each) and its RUN."""
    loads = -(-input_bytes // frames.LOAD_CHUNK)
    frame = frames.HEADER + frames.TRAILER
    return input_bytes + loads * (frame + 4) + frame + frames.RUN_FIXED


class _Chunks:
    """Which inputs each turn over the variants runs, by policy (docs/dataset.md "Datasets larger than
    the store", where ``never``, ``always`` and ``auto`` are)."""

    SWITCH_S = 1.0  # a slot switch before one was measured (bench/bench_time_model.py: boot + HELLO + baud)

    def __init__(self, n: int, policy: str, *, random: bool, variants: int) -> None:
        self.n, self.policy, self.off = n, policy, random or variants < 2 or policy == "never"
        self.start, self.cap, self.count, self.input_bytes = 0, 0, 0, 0
        self.ids: range | None = None
        self.keep: frozenset[int] | None = None
        self.chunked: bool | None = None if policy == "auto" else policy == "always"
        self.switch_s: list[float] = []
        self.invoke_s: dict[str, float] = {}
        self.first: list[str] = []
        self.why = ""

    def next_turn(self, order: list[str], resident: ResidentBoard) -> list[str] | None:
        """The variants of the next part, the one running now first; None: every input ran."""
        if self.start >= self.n and self.count > 0:
            return None
        running = resident.current.variant if resident.current is not None else None
        if running in order:
            order.remove(running)
            order.insert(0, running)
        self.ids = None
        self.count += 1
        return order

    def part(self, hello: frames.Hello) -> tuple[range, frozenset[int] | None]:
        """This part's inputs and those to keep, fixed by the first variant that booted into it."""
        if self.ids is None:
            self.input_bytes = hello.input_bytes
            self.cap = hello.keep_capacity
            rest = self.n - self.start
            if self.start == 0 and (self.off or self.cap == 0 or rest <= self.cap or self.chunked is False):
                self.ids, self.keep = range(self.n), None  # one part: the store keeps what it holds
            elif self.chunked is False or self.cap == 0:  # the rest in one part, uploaded to each variant
                self.ids, self.keep = range(self.start, self.n), frozenset()  # (no store on this boot)
            else:  # a chunk: uploaded and kept by the first variant, run from the store by the next
                self.ids = range(self.start, min(self.n, self.start + self.cap))
                self.keep = frozenset(self.ids)
        return self.ids, self.keep

    def booted(self, variant: str, seconds: float) -> None:
        if self.first and variant != self.first[-1]:
            self.switch_s.append(seconds)  # a boot after another variant's part: a slot switch
        self.first.append(variant)

    def ran(self, variant: str, invoke_us: Sequence[int | None]) -> None:
        got = sorted(u for u in invoke_us if u)
        if got:
            self.invoke_s[variant] = got[len(got) // 2] / 1e6

    def advance(self, rate: float) -> bool:
        """After a part: where the next starts; False when none follows."""
        if self.ids is None:
            return False  # no variant booted into this part
        self.start = self.ids.stop
        if self.start < self.n and self.chunked is None:
            self.chunked, self.why = self.pays(rate)
        return self.start < self.n

    def pays(self, rate: float) -> tuple[bool, str]:
        """``auto``'s rule for the rest (docs/dataset.md "Datasets larger than the store": whether chunks
        pay): (chunks, the figures that decided)."""
        rest = self.n - self.start
        if self.cap == 0:
            return False, "no kept-input store"
        parts = -(-rest // self.cap)
        switch = max(self.switch_s) if self.switch_s else self.SWITCH_S
        if parts == 1:
            return True, "the rest fits the store: one chunk costs the slot switch the rest costs anyway"
        if rate <= 0 or not self.invoke_s:
            return False, "no link rate to model (a link without a baud): the rest uploaded to each variant"
        upload = upload_bytes(self.input_bytes) / rate
        hidden = sum(max(0.0, upload - t) for t in self.invoke_s.values()) / len(self.invoke_s)
        saved, cost = rest * hidden, (parts - 1) * switch
        figures = f"saves {saved:.1f} s of link time, costs {parts - 1} more slot switches ({cost:.1f} s)"
        return saved > cost, figures

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity": self.cap,
            "parts": self.count,
            "chunked": bool(self.chunked) and self.count > 1,
            "why": self.why,
            "slot_switch_s": [round(x, 3) for x in self.switch_s],
        }


def _expected(host: Sequence[Leg] | None, earlier: Sequence[Sequence[Leg]]) -> dict[int, tuple[int, ...]]:
    """The CRC-32s a variant is expected to print: the first earlier variant's, else the host's."""
    exp: dict[int, tuple[int, ...]] = {}
    for legs in [*earlier, host or []]:
        for i, leg in enumerate(legs):
            if i not in exp and leg.ok and leg.crcs is not None:
                exp[i] = leg.crcs
    return exp


def _passes(ctx: _Streams, boot: Boot, run: VariantRun, ids: Sequence[int], ask: _Ask) -> None:
    """The main pass over ``ids``, then re-runs (docs/dataset.md) of the inputs whose results were lost
    or damaged, at most ``MAX_PASSES`` in all and only while a pass still brings some of them back."""
    resident, out, v = ctx.resident, ctx.out, run.variant
    assert run.serial_log is not None
    for attempt in range(1, MAX_PASSES + 1):
        if resident.current is not boot:  # the app restarted or the link dropped: boot it again
            again = boot_variant(resident, run)
            if not isinstance(again, Boot):
                break
            boot = again
        asked = dataclasses.replace(ask, now=attempt > 1)
        one = functools.partial(_stream, ctx, boot, ids, run.serial_log, asked, kept=out.kept)
        streamed = resident.rec.run("dataset" if attempt == 1 else "dataset-retry", v, one)
        legs, stats, problems = streamed.legs, streamed.stats, streamed.problems
        for i, leg in legs.items():
            out.legs[v][i] = _second_result(out.legs[v][i], leg)
        _record(out, run, streamed)
        out.passes.setdefault(v, []).append(
            {"inputs": len(ids), "problems": problems, "link": stats.to_dict()}
        )
        lost = [i for i, leg in legs.items() if leg.status in _TRANSIENT]
        if not lost or (len(lost) == len(ids) and attempt > 1):  # the first re-run sends results at once:
            break  # what a hang kept in the device's batch comes back then
        ids = lost
        out.link[v].retransmitted_frames += len(ids)  # a re-run is a repair: never a clean match


def _fetch(ctx: _Streams, order: Sequence[str], host: Sequence[Leg] | None) -> None:
    """--results crc: fetch in full the outputs a comparison still needs (a CRC differs and no leg with
    the same CRC-32s holds the bytes)."""
    out = ctx.out
    for v in order:
        need = []
        for i, leg in enumerate(out.legs[v]):
            if not leg.ok or leg.data is not None:
                continue
            others = [out.legs[w][i] for w in out.legs if w != v] + ([host[i]] if host else [])
            differ = any(o.ok and o.crcs != leg.crcs for o in others)
            inferable = any(o.ok and o.crcs == leg.crcs and o.data is not None for o in others)
            if differ and not inferable:
                need.append(i)
        if not need:
            continue
        boot = boot_variant(ctx.resident, ctx.runs[v])
        if not isinstance(boot, Boot):
            out.errors.append(f"{v}: could not boot to fetch {len(need)} input(s) in full")
            continue
        _passes(ctx, boot, ctx.runs[v], need, _Ask(frames.RES_FULL))


def _after_reset(ctx: _Streams, variant: str) -> dict[str, Any]:
    """Reset the board, run the first inputs again on ``variant``: a fresh boot must give the same CRCs."""
    resident, runs, out = ctx.resident, ctx.runs, ctx.out
    ids = list(range(min(RESET_CHECK_INPUTS, len(ctx.dataset.items))))
    resident.current = None  # the next boot is a reset
    boot = boot_variant(resident, runs[variant])
    if not isinstance(boot, Boot):
        return {"variant": variant, "inputs": 0, "differing": [], "problem": "the app did not start again"}
    log = runs[variant].serial_log or Path("serial.log")
    one = functools.partial(_stream, ctx, boot, ids, log, _Ask(frames.RES_CRC))
    streamed = resident.rec.run("after-reset", variant, one)
    legs, problems = streamed.legs, streamed.problems
    _record(out, runs[variant], streamed)
    first = out.legs[variant]
    differing = [i for i in ids if legs[i].ok and first[i].ok and legs[i].crcs != first[i].crcs]
    lost = [i for i in ids if not legs[i].ok]
    return {
        "variant": variant,
        "inputs": len(ids),
        "differing": differing,
        "not_run": lost,
        "problems": problems,
    }


# ---- the job: load, host reference, firmware, board, verdicts ---------------------------------------


@dataclasses.dataclass(frozen=True)
class DatasetOptions:
    """What ``--dataset`` / ``--random-inputs`` asked for."""

    source: str | Path | None = None  # directory, .npz or .txt list
    random_inputs: int | None = None
    seed: int = 0
    results: str = "full"  # full | crc
    labels: str | Path | None = None
    repeat: int = 1
    tap_inputs: tuple[str, ...] = ()  # dataset indices ("3") and/or "worst": tapped after the run
    chunks: str = "auto"  # a dataset larger than the kept-input store: auto | always | never (_Chunks)

    def check(self) -> None:
        if (self.source is None) == (self.random_inputs is None):
            raise UsageError("give either --dataset or --random-inputs", hint="one source of inputs per run")
        if self.results not in ("full", "crc"):
            raise UsageError(f"--results {self.results!r}", hint="use full or crc")
        if self.chunks not in ("auto", "always", "never"):
            raise UsageError(f"--keep-chunks {self.chunks!r}", hint="use auto, always or never")
        if not 1 <= self.repeat <= 1000:
            raise UsageError(f"--repeat {self.repeat}: give 1 to 1000")
        if self.labels is not None and self.random_inputs is not None:
            raise UsageError("--labels needs --dataset (random inputs have no labels)")
        for t in self.tap_inputs:
            if t != "worst" and not (t.isascii() and t.isdigit()):
                raise UsageError(
                    f"--tap-inputs {t!r} is neither a dataset index nor 'worst'",
                    hint="give comma-separated indices counted from 0 (report.json dataset.analysis.rows) "
                    "and/or 'worst' (the top-ranked disagreeing input), e.g. --tap-inputs 3,17,worst",
                )


@dataclasses.dataclass
class DatasetOutcome:
    dataset: Dataset
    analysis: DatasetAnalysis | None = None
    run: DatasetRun | None = None
    host: list[Leg] | None = None
    tap_inputs: list[dict[str, Any]] | None = None  # --tap-inputs: the inputs tapped, as written out
    tap_notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        ds = self.dataset
        doc: dict[str, Any] = {
            "source": ds.source,
            "random_seed": ds.seed,
            "inputs": len(ds.items),
            "classes": ds.classes,
            "host_reference": self.host is not None,
        }
        if self.analysis is not None:
            doc["analysis"] = self.analysis.to_dict()
        if self.run is not None:
            doc["link"] = {v: s.to_dict() for v, s in self.run.link.items()}
            doc["passes"] = self.run.passes
            doc["after_reset"] = self.run.after_reset
            doc["chunks"] = self.run.chunks
        if self.tap_inputs is not None:
            doc["tap_inputs"] = self.tap_inputs
            doc["tap_notes"] = self.tap_notes
        return doc


def pick_tap_inputs(outcome: DatasetOutcome, spec: Sequence[str]) -> list[tuple[int, str]]:
    """``--tap-inputs``: (index, why) per chosen input, in order, without repeats. ``worst`` is the
    top-ranked disagreeing input of the analysis; when none disagrees it picks nothing (and says so)."""
    picked: dict[int, str] = {}
    for t in spec:
        if t != "worst":
            picked.setdefault(int(t), "index")
            continue
        worst = outcome.analysis.disagreeing(1) if outcome.analysis is not None else []
        if worst:
            picked.setdefault(worst[0].index, "worst")
        else:
            outcome.tap_notes.append("--tap-inputs worst: no input disagrees, so none was picked for it")
    return list(picked.items())


def write_tap_inputs(
    dataset: Dataset, picks: Sequence[tuple[int, str]], tensor: TensorInfo, where: Path
) -> list[dict[str, Any]]:
    """Each chosen input as the exact tensor the device ran, in a .npy of the model's dtype (taken as
    already quantized by --input): the tap run and a bug report reproduce it from this file."""
    where.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(tensor.dtype).newbyteorder("<")
    out = []
    for i, why in picks:
        path = where / f"input-{i:05d}.npy"
        np.save(
            path, np.frombuffer(dataset.items[i].data, dtype=dtype).reshape(tensor.shape).astype(tensor.dtype)
        )
        out.append({"index": i, "name": dataset.items[i].name, "chosen_as": why, "file": str(path)})
    return out


def load_inputs(opts: DatasetOptions, tensor: TensorInfo, input_options: InputOptions | None) -> Dataset:
    """The dataset the options name, every --tap-inputs index one of its inputs (usage errors before any
    hardware)."""
    opts.check()
    if opts.random_inputs is not None:
        ds = random_dataset(opts.random_inputs, opts.seed, tensor)
    else:
        assert opts.source is not None
        ds = load_dataset(opts.source, tensor, input_options, opts.labels)
    n = len(ds)
    bad = [t for t in opts.tap_inputs if t != "worst" and int(t) >= n]
    if bad:
        raise UsageError(
            f"--tap-inputs {bad[0]}: the dataset has {n} input(s), indices 0..{n - 1}",
            hint="indices count from 0 in the dataset's order (report.json dataset.analysis.rows)",
        )
    return ds


HOST_CHUNK = 256  # inputs per host reference child (bounded time and memory per child)


def host_legs(
    model: Path, info: ModelInfo, dataset: Dataset, rec: Recorder, stop: threading.Event | None = None
) -> list[Leg]:
    """The host reference's outputs for every input (cached on disk by the hostrun child)."""
    tin = info.inputs[0]
    dt = np.dtype(tin.dtype).newbyteorder("<")
    model_bytes = model.read_bytes()

    def run() -> list[Leg]:
        legs: list[Leg] = []
        for k in range(0, len(dataset.items), HOST_CHUNK):
            part = dataset.items[k : k + HOST_CHUNK]
            arrays = [[np.frombuffer(it.data, dt).reshape(tin.shape)] for it in part]
            legs += [
                host_leg(r.outputs) for r in reference.run_reference(model_bytes, arrays, stop=stop).runs
            ]
        return legs

    return rec.run("reference", None, run)


class HostLegsJob:
    """:func:`host_legs` in a thread of its own, so that the host reference (a child process) runs while
    the board is flashed and the dataset streams. :meth:`result` waits for it and returns the legs or
    raises what it raised (the same each time); :meth:`cancel` kills its child, so a run that ends early
    (an error, Ctrl-C, SIGTERM) leaves none behind."""

    def __init__(self, model: Path, info: ModelInfo, dataset: Dataset, rec: Recorder) -> None:
        self._stop = threading.Event()
        self._legs: Future[list[Leg]] = Future()
        self.taken = False  # result() was called
        self._thread = threading.Thread(
            target=self._run, args=(model, info, dataset, rec), name="host-reference", daemon=True
        )
        self._thread.start()

    def _run(self, model: Path, info: ModelInfo, dataset: Dataset, rec: Recorder) -> None:
        try:
            self._legs.set_result(host_legs(model, info, dataset, rec, self._stop))
        except BaseException as exc:  # handed to result() in the caller's thread
            self._legs.set_exception(exc)

    def result(self) -> list[Leg]:
        self.taken = True
        return self._legs.result()

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()


def verdicts(
    outcome: DatasetOutcome,
    runs: Mapping[str, VariantRun],
    outputs: Sequence[OutputSpec],
    tolerance_lsb: float,
    ref_tolerance_lsb: float,
    rec: Recorder,
) -> None:
    """Per-input verdicts, and the exit codes and errors they, the link (a failed ``link`` stage in
    ``rec``) and the reset check imply (added to the run's own)."""
    run = outcome.run
    assert run is not None
    ds = outcome.dataset
    legs: dict[str, Sequence[Leg]] = {v: run.legs[v] for v in VARIANTS if v in run.legs}
    if outcome.host is not None:
        legs["host"] = outcome.host
    labels = [ds.label_index(it) for it in ds.items]
    outcome.analysis = analyze(
        [it.name for it in ds.items], labels, outputs, legs,
        tolerance_lsb=tolerance_lsb, ref_tolerance_lsb=ref_tolerance_lsb,
    )  # fmt: skip
    run.codes.append(outcome.analysis.exit_code)
    for v, legs_v in run.legs.items():
        if v in runs:
            runs[v].capture_valid = all(leg.ok for leg in legs_v)
    for v, stats in run.link.items():
        if not stats.clean and v in runs:
            run.codes.append(link_verdict(runs[v], stats, None, rec) or ExitCode.INFRASTRUCTURE)
    reset = run.after_reset
    if reset is not None and reset.get("differing"):
        run.codes.append(ExitCode.MISMATCH)
        run.errors.append(
            f"after a reset, the {reset['variant']} app gave other outputs for input(s) "
            f"{reset['differing'][:10]}: it is not deterministic across boots"
        )
