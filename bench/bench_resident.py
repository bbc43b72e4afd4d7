"""The resident loop and dataset mode in figures, in one run on the simulated board, throttled both
ways (serial link and flash writes) to a real UART rate.

Prints, each measured in this run (nothing here asserts timing):
- link efficiency (payload / bytes on the wire) of the U-Net 48 dataset stream with ``--results full``:
  device to host (its outputs) and host to device (its streamed inputs);
- bytes written to flash on an identical repeat run and on an input-only change;
- an identical repeat with and without the HELLO probe: esptool sessions, boots,
  flash stage and wall seconds, then U-Net 48 -> 64 on the same board: bytes written per region
  (only the model region should be written), and a U-Net 48 stream at the console baud vs the fast link
  (``--repeat-only`` stops after these);
- host overhead per run: wall time outside the link-bound stages (flash, boot, capture, dataset);
- N inputs as one dataset run vs the baseline "one flash-and-compare per input, each on a board
  that must be written in full" (see BASELINE below), measured on --baseline-runs inputs and scaled;
- N=1000 random inputs on U-Net 48 and cnn_classifier_11 (wall time, s/input);
- what esptool's per-packet hex formatting costs (it formats every packet even with tracing off);
- each input crossing the link once, and the device->host goal (``--keep-only`` prints only these): N
  uploaded inputs of U-Net 48 and cnn_classifier_11 through a check, host->device bytes per variant (the
  second runs the inputs the first kept: docs/protocol.md "Kept inputs"), and device->host bytes per input
  in full mode, measured on the stream and through the firmware's C loop for 2-, 11- and 2,304-byte outputs
  (and a 2,304-byte output at U-Net 48's ANSI C invoke time, 0.97 s: a slow model's results batched by
  time), and N random inputs of U-Net 48 on the stream (the device holds its inputs: results and ACKs only).

Usage: python bench/bench_resident.py [--baud 921600] [--n 100] [--n-big 1000] [--baseline-runs 3]
                                     [--repeat-only] [--keep-only]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from simrun import stage_seconds, timed_run

from harness.flows.dataset import DatasetOptions

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
UNET = MODELS / "unet_mbv2_035_48.tflite"
CNN = MODELS / "cnn_classifier_11.tflite"
LINK_STAGES = {"flash", "boot", "capture", "select-slot", "dataset", "after-reset"}
BASELINE = (
    "today's product has no compiled-in-inputs mode left (inputs are always streamed), so the baseline "
    "is the closest honest one: one flash-and-compare per input on a FRESH simulated board (empty flash: "
    "table, model and both apps written at the throttled rate, as the old way reflashed both apps for "
    "every input), build cache warm (the old way also REBUILT both variants per input: the baseline is "
    "cheaper than the old way, so the ratio understates the gain)"
)


def _written(result: Any) -> int:
    """Bytes written by the run's one esptool session (both variants report that same session)."""
    flash = next((r.flash for r in result.variants.values() if r.flash), None)
    return sum(x["bytes_written"] for x in flash["regions"]) if flash else 0


def _overhead(wall: float, res: Any) -> float:
    return wall - sum(sec for name, sec in stage_seconds(res).items() if name in LINK_STAGES)


def _hex_cost() -> tuple[float, int]:
    """Seconds esptool spends formatting one 16 KB flash packet as hex (its f-string trace argument)."""
    from esptool.loader import HexFormatter

    buf = bytes(range(256)) * 64 + bytes(16)
    t0 = time.perf_counter()
    for _ in range(50):
        f"{'Write 16400 bytes:':<21} {HexFormatter(buf)}"
    return (time.perf_counter() - t0) / 50, len(buf)


def _repeat_before_after(tmp: Path, model: Path, inputs: list[Path], port: str, baud: int) -> None:
    """An identical repeat on a board that holds the builds: "before" runs esptool as the product did
    until the HELLO probe (its ``probe`` made a no-op here: MD5 of every region, nothing written), "after"
    reads the app's HELLO and runs no esptool session."""
    from harness.flows.resident import ResidentBoard
    from harness.sim.board import get_board

    board = get_board(port.split("//")[1].split("?")[0])
    rows = []
    for tag in ("before", "after"):
        saved = ResidentBoard.probe
        if tag == "before":
            ResidentBoard.probe = lambda self, log_path: None  # type: ignore[method-assign,assignment]
        try:
            s0, b0 = board.download_sessions, board.boots
            w, r = timed_run(tmp, f"repeat-{tag}", model, inputs, port, baud)
        finally:
            ResidentBoard.probe = saved  # type: ignore[method-assign]
        st = stage_seconds(r)
        rows.append(
            (tag, w, st.get("flash", 0.0), board.download_sessions - s0, board.boots - b0, _written(r), r)
        )
    print(f"\nidentical repeat, {model.stem}, before / after the HELLO probe:")
    for tag, w, fl, sessions, boots, written, r in rows:
        print(f"  {tag:<7} wall {w:6.2f} s  flash stage {fl:5.2f} s  esptool sessions {sessions}  "
              f"boots {boots}  written {written} B  verdict {r.verdict}")  # fmt: skip
    print(
        f"  flash stage after / before: {rows[1][2] / max(rows[0][2], 1e-9):.2f}; "
        f"wall after / before: {rows[1][1] / max(rows[0][1], 1e-9):.2f}"
    )


def _model_change(tmp: Path, port: str, baud: int) -> None:
    """U-Net 48 -> 64 (same ops, another arena) on a board holding the 48 builds: what the flash writes
    (the arena travels in the model partition's header, so only the model)."""
    model, png = MODELS / "unet_mbv2_035_64.tflite", MODELS / "inputs/unet_mbv2_035_64.png"
    w, r = timed_run(tmp, "model-64", model, [png], port, baud)
    flash = next((x.flash for x in r.variants.values() if x.flash), None) or {"regions": []}
    by_role: dict[str, int] = defaultdict(int)
    for reg in flash["regions"]:
        by_role[f"{reg['role']}{'-' + reg['variant'] if reg.get('variant') else ''}"] += reg["bytes_written"]
    print(f"\nmodel change U-Net 48 -> 64 on the same board: wall {w:.2f} s, written {_written(r)} B "
          f"({', '.join(f'{k} {v}' for k, v in sorted(by_role.items()))}), verdict {r.verdict}")  # fmt: skip


def _fast_link_before_after(tmp: Path, baud: int, n: int) -> None:
    """U-Net 48, ``n`` streamed inputs, ``--results full``, on a throttled board whose console is 115200
    (boards/sim.toml): "before" keeps the loop at the console baud (``_fast_link`` made a no-op here),
    "after" switches to the board's link_baud (921600) after each HELLO."""
    from harness.flows.resident import ResidentBoard

    npz = tmp / "fast.npz"
    np.savez(npz, x=np.random.default_rng(5).uniform(-1, 1, (n, 48, 48, 3)).astype(np.float32))
    rows = []
    for tag in ("before", "after"):
        saved = ResidentBoard._fast_link
        if tag == "before":
            ResidentBoard._fast_link = lambda self, boot, variant, log_path: None  # type: ignore[method-assign,assignment]
        try:
            port = f"sim://bench-fast-{tag}-{uuid.uuid4().hex[:6]}?throttle={baud}"
            w, r = timed_run(
                tmp, f"fast-{tag}", UNET, [], port, baud, dataset=DatasetOptions(source=npz, results="full")
            )
        finally:
            ResidentBoard._fast_link = saved  # type: ignore[method-assign]
        links = [s.detail for s in r.stages if s.stage == "link-baud"]
        rows.append((tag, w, stage_seconds(r).get("dataset", 0.0), links[:1], r.verdict))
    print(f"\nfast link, U-Net 48, {n} streamed inputs, --results full, console 115200:")
    for tag, w, ds, links, verdict in rows:
        print(
            f"  {tag:<7} wall {w:6.2f} s  dataset (link) stage {ds:6.2f} s  "
            f"{links or ['console baud']}  {verdict}"
        )
    print(f"  dataset stage after / before: {rows[1][2] / max(rows[0][2], 1e-9):.2f}")


def _kept_inputs(tmp: Path, baud: int, n: int) -> None:
    """N new inputs through one check: each variant's host->device bytes and device->host bytes per input."""
    print(f"\n{n} uploaded inputs, --results full, one check (each input crosses once):")
    for model, shape, tag in ((UNET, (48, 48, 3), "U-Net 48"), (CNN, (32, 32, 3), "cnn_classifier_11")):
        npz = tmp / f"keep-{model.stem}.npz"
        np.savez(npz, x=np.random.default_rng(25).uniform(-1, 1, (n, *shape)).astype(np.float32))
        port = f"sim://bench-keep-{uuid.uuid4().hex[:6]}?throttle={baud}&invoke_time=model"
        w, r = timed_run(tmp, f"keep-{model.stem}", model, [], port, baud,
                    dataset=DatasetOptions(source=npz, results="full"))  # fmt: skip
        links = (r.dataset or {}).get("link", {})
        up = sum(x["tx_bytes"] for x in links.values())
        print(f"  {tag}: host->device {up} B for the check, wall {w:.1f} s, verdict {r.verdict}")
        for v, x in links.items():
            per, over = x["bytes_per_input_device_to_host"], x["overhead_per_input_device_to_host"]
            print(f"    {v:<9} host->device {x['tx_bytes']:>8} B ({x['kept_runs']} inputs run from the kept "
                  f"store, {x['kept_fallbacks']} not kept after all); device->host per input "
                  f"{per} B = output + {over}")  # fmt: skip


def _random_stream(tmp: Path, baud: int, n: int) -> None:
    """U-Net 48, N random inputs, --results full, modelled invoke times: device->host bytes per input."""
    print(
        f"\n{n} random inputs of U-Net 48, --results full (the device holds its inputs; goal: output + 16):"
    )
    port = f"sim://bench-rnd-{uuid.uuid4().hex[:6]}?throttle={baud}&invoke_time=model"
    opts = DatasetOptions(random_inputs=n, seed=25, results="full")
    w, r = timed_run(tmp, "rnd-unet", UNET, [], port, baud, dataset=opts)
    print(f"  wall {w:.1f} s, verdict {r.verdict}")
    for v, x in ((r.dataset or {}).get("link", {})).items():
        per, over = x["bytes_per_input_device_to_host"], x["overhead_per_input_device_to_host"]
        print(f"    {v:<9} device->host per input {per} B = output + {over} "
              f"({x['frames_received']} frames, {x['probes']} probes)")  # fmt: skip


def _budget_through_the_c_loop(n: int = 100) -> None:
    """Device->host bytes per input in full mode, results only (the device holds its inputs), through the
    firmware's own C loop: every byte after the HELLO line (RESULT frames, ACKs, the SYNC_ACK)."""
    import hashlib

    from harness.protocol import frames as fr
    from harness.protocol.loop import LoopConfig, LoopOutput
    from harness.protocol.native import make_loop

    class App:
        def __init__(self, size: int) -> None:
            self.out, self.size, self.us = bytearray(), size, 1000

        def write(self, d: bytes) -> None:
            self.out += d

        def invoke(self, data: bytes) -> tuple[int, int, list[bytes]]:
            return 0, self.us, [(hashlib.sha256(data).digest() * (self.size // 32 + 1))[: self.size]]

        def session_begin(self, em: Any, k: int) -> None: ...
        def text_extra(self, em: Any, i: int) -> None: ...
        def sha256_hex(self, d: bytes) -> str:
            return hashlib.sha256(d).hexdigest()

        def boot_slot(self, s: int) -> int:
            return 0

        def set_baud(self, b: int) -> None: ...

    print(f"\ndevice->host bytes per input, --results full, {n} inputs the device holds (the C loop; goal: "
          "output + 16):")  # fmt: skip
    key = fr.key_crc(7, "optimized")
    for size, us in ((2, 1000), (11, 1000), (2304, 1000), (2304, 967_593)):
        out = LoopOutput(size, "int8", (1, size), 0.5, 0, "o")
        cfg = LoopConfig(input_bytes=6912, input_dtype="int8", window=16384, nn="optimized", slot=0,
                         model_sha256="ab" * 32, session=7, outputs=[out])  # fmt: skip
        app = App(size)
        app.us = us
        loop = make_loop(cfg, app, backend="c")
        loop.hello()
        hello = len(app.out)
        for i in range(n):
            run = fr.encode_run(i, source=fr.SRC_PRNG, seed=1, results=fr.RES_FULL)
            loop.rx(fr.encode_frame(fr.CMD_RUN, i, run, key=key))
        loop.rx(fr.encode_frame(fr.CMD_SYNC, n, b"sync", key=key))
        loop.idle()
        per = (len(app.out) - hello) / n
        what = f"{size:>5} B output, {us / 1e6:.3f} s invokes"
        print(f"  {what}: {per:8.2f} B per input = output + {per - size:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baud", type=int, default=921600)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--n-big", type=int, default=1000)
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--stream-inputs", type=int, default=20)
    ap.add_argument("--repeat-only", action="store_true", help="stop after the repeat before/after figures")
    ap.add_argument("--keep-only", action="store_true", help="only the kept-input and device->host figures")
    args = ap.parse_args()
    baud = args.baud
    throttle = f"throttle={baud}"
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        if args.keep_only:
            print(f"simulated board throttled to {baud} baud both ways, modelled invoke times")
            _budget_through_the_c_loop()
            _kept_inputs(tmp, baud, args.n)
            _random_stream(tmp, baud, args.n)
            return
        board = f"sim://bench-res-{uuid.uuid4().hex[:6]}?{throttle}"
        png = MODELS / "inputs" / "unet_mbv2_035_48.png"
        other = tmp / "other.npy"
        np.save(other, np.random.default_rng(1).uniform(-1, 1, (1, 48, 48, 3)).astype(np.float32))
        print(f"simulated board throttled to {baud} baud both ways (serial and flash writes)\n")

        w1, r1 = timed_run(tmp, "first", UNET, [png], board, baud)
        w2, r2 = timed_run(tmp, "repeat", UNET, [png], board, baud)
        w3, r3 = timed_run(tmp, "input-change", UNET, [other], board, baud)
        print("U-Net 48, one input, the same board:")
        for tag, w, r in (("first run", w1, r1), ("identical repeat", w2, r2), ("input-only change", w3, r3)):
            print(f"  {tag:<18} wall {w:6.2f} s  flash written {_written(r):>9} B  host overhead "
                  f"{_overhead(w, r):.2f} s  verdict {r.verdict}")  # fmt: skip
        st = stage_seconds(r2)
        print(
            "  identical repeat, stages: "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(st.items(), key=lambda kv: -kv[1]))
        )
        _repeat_before_after(tmp, UNET, [png], board, baud)
        _model_change(tmp, board, baud)
        _fast_link_before_after(tmp, baud, args.stream_inputs)
        if args.repeat_only:
            return

        npz = tmp / "unet.npz"
        rng = np.random.default_rng(7)
        np.savez(npz, x=rng.uniform(-1, 1, (args.stream_inputs, 48, 48, 3)).astype(np.float32))
        ws, rs = timed_run(
            tmp, "stream", UNET, [], board, baud, dataset=DatasetOptions(source=npz, results="full")
        )
        print(f"\nlink efficiency, U-Net 48 dataset of {args.stream_inputs} streamed inputs, --results full "
              f"(goal >= 0.90): wall {ws:.2f} s")  # fmt: skip
        for v, link in (rs.dataset or {}).get("link", {}).items():
            print(f"  {v:<9} host->device {link['efficiency_host_to_device']:.4f} ({link['tx_payload']} / "
                  f"{link['tx_bytes']} B)  device->host {link['efficiency_device_to_host']:.4f} "
                  f"({link['rx_payload']} / {link['rx_bytes']} B)")  # fmt: skip

        cnn_board = f"sim://bench-cnn-{uuid.uuid4().hex[:6]}?{throttle}"
        wn, rn = timed_run(tmp, "n", CNN, [], cnn_board, baud,
                      dataset=DatasetOptions(random_inputs=args.n, seed=3, results="full"))  # fmt: skip
        cnn_in = MODELS / "inputs" / "cnn_classifier_11.npy"
        base = []
        for k in range(args.baseline_runs):
            fresh = f"sim://bench-base-{uuid.uuid4().hex[:6]}?{throttle}"
            wb, rb = timed_run(tmp, f"base{k}", CNN, [cnn_in], fresh, baud)
            base.append((wb, _written(rb)))
        per = sum(w for w, _ in base) / len(base)
        print(f"\nN={args.n} inputs, cnn_classifier_11:")
        print(f"  dataset run (--random-inputs {args.n}, --results full): wall {wn:.2f} s, "
              f"{wn / args.n:.4f} s/input, verdict {rn.verdict}")  # fmt: skip
        print(f"  baseline: {args.baseline_runs} runs, {per:.2f} s/input (each wrote {base[0][1]} B); "
              f"x{args.n} = {per * args.n:.1f} s")  # fmt: skip
        print(f"  ratio baseline / dataset: {per * args.n / wn:.1f}x (goal >= 20x)")
        print(f"  baseline is: {BASELINE}")

        print(f"\nN={args.n_big} random inputs, --results crc:")
        for model, tag in ((UNET, "U-Net 48"), (CNN, "cnn_classifier_11")):
            port = f"sim://bench-big-{uuid.uuid4().hex[:6]}?{throttle}"
            opts = DatasetOptions(random_inputs=args.n_big, seed=9, results="crc")
            wb, rb = timed_run(tmp, f"big-{model.stem}", model, [], port, baud, dataset=opts)
            ds = stage_seconds(rb).get("dataset", 0.0)
            print(f"  {tag:<18} wall {wb:7.2f} s, {wb / args.n_big:.4f} s/input (dataset stage {ds:.2f} s), "
                  f"verdict {rb.verdict}")  # fmt: skip

        cost, size = _hex_cost()
        packets = max(1, round(1_096_048 / 0x4000))
        print(
            f"\nesptool hex trace formatting (evaluated per packet even with tracing off): "
            f"{cost * 1e3:.2f} ms per {size} B packet; a full write of both U-Net apps (~{packets} "
            f"packets) {cost * packets:.2f} s; a repeat run writes no packets (regions skipped by MD5)"
        )


if __name__ == "__main__":
    main()
