"""A time model of a real board: where a check's time would go on an ESP32-S3, from what a run measured.

The simulated board counts what a real one would move: the bytes esptool writes (compressed as esptool
compresses them), the bytes each way on the console link, the number of boots, and each ``Invoke``'s
time from the firmware's ``TIME`` records (the simulator's documented cycle model, docs/simulator.md).
This script runs the check scenarios (a repeat check, new inputs, a new model) on the simulated board, takes
those counts, and projects the time per stage on a real board with the assumptions below, each stated with
its source. It then checks the byte-driven parts of the model against the simulator run at the same baud
(projected vs measured), and prints the figures against their goals. Nothing here asserts; every number is
measured in this run or derived from the stated assumptions.

Assumptions (real board; change them with the flags):
- esptool session (only when something must be flashed or verified): the flasher stub is uploaded at
  the ROM's 115200 baud before the baud changes; its size is read from the installed esptool's stub
  JSON (``esptool/targets/stub_flasher``). Reset into the loader, sync and the baud change: 0.3 s,
  an ESTIMATE (esptool's reset sequence waits ``reset_delay`` = 0.05 s per
  https://docs.espressif.com/projects/esptool/en/latest/esp32s3/esptool/configuration-file.html;
  syncing and the USB-UART bridge add the rest). Each region's MD5 check: 8 MB/s (ESTIMATE).
- flash write rate: esptool sends zlib-compressed data; its effective rate on the wire is 0.77 of the
  UART's byte rate, from ESP-IDF's own example session (136672 B, 67544 compressed, written in 1.9 s at
  460800 baud: 67544 / 1.9 / 46080 = 0.77), https://docs.espressif.com/projects/esp-idf/en/stable/esp32s3/get-started/linux-macos-setup.html
  (section "Flash onto the Device").
- boot to ``app_main``: 0.3 s per boot, "generally around 300 milliseconds" for an unoptimized start-up on
  ESP32-S3 (ESP-IDF 5.2.1), https://docs.espressif.com/projects/esp-techpedia/en/latest/esp-friends/advanced-development/performance/reduce-boot-time.html
- PSRAM memory test at each boot (``CONFIG_SPIRAM_MEMTEST``, on by default in ESP-IDF): 1.0 s for 8 MB,
  an ESTIMATE. ESP-IDF names it among the largest start-up costs and says to disable it for a faster
  start (https://esp32.com/viewtopic.php?p=39294, answer by an Espressif engineer;
  https://docs.espressif.com/projects/esp-idf/en/stable/esp32s3/api-guides/performance/speed.html,
  "Improving Startup Time"). Measure yours from the boot log timestamps and pass ``--memtest-s``.
- console link: 8N1 UART, 10 bits per byte at the link baud (the board file's ``monitor_baud``, 115200
  for every built-in board today, or the fast link's baud: ``--link-baud``); USB-Serial-JTAG is not
  modelled.
- inference: the sum of the ``TIME invoke_us`` the firmware reported (on the simulator, its cycle model).
- host: the host stages' wall time in this run (generate, build, compare, and the host reference, of
  which a dataset run counts only what the stream did not overlap): this machine.
- ``--flash-skipped``: the board already holds the right images and HELLO says so (no esptool session,
  one boot fewer: the HELLO flash skip). Without it, a check opens one esptool session.

Usage: python bench/bench_time_model.py [--baud 921600] [--n 100] [--link-baud 115200 921600]
       [--memtest-s 1.0] [--boot-s 0.3] [--flash-skipped] [--chunks-only]
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import re
import tempfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from simrun import stage_seconds, timed_run

from harness.chips import ROM_BAUD
from harness.flows.dataset import DatasetOptions

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
UNET48 = MODELS / "unet_mbv2_035_48.tflite"
UNET64 = MODELS / "unet_mbv2_035_64.tflite"
HOST_STAGES = {"generate", "build", "compare", "report"}  # and "reference", below
TIME_RE = re.compile(rb"TIME i=\d+ invoke_us=(\d+)")


@dataclass(frozen=True)
class Assumptions:
    """The real board's figures (see the module docstring for each one's source)."""

    connect_s: float = 0.3  # reset into the loader, sync, baud change (estimate)
    md5_bytes_per_s: float = 8e6  # the stub's MD5 of a region (estimate)
    write_efficiency: float = 0.77  # compressed bytes on the wire / UART byte rate (ESP-IDF example)
    boot_s: float = 0.3  # reset to app_main (ESP techpedia, S3)
    memtest_s: float = 1.0  # PSRAM memory test per boot, 8 MB (estimate)
    psram: bool = True
    flash_baud: int = 921600  # board file flash_baud


def stub_bytes(chip: str = "esp32s3") -> int:
    """Bytes of esptool's flasher stub for ``chip`` (text + data), as esptool uploads it."""
    import esptool

    base = Path(esptool.__file__).parent / "targets" / "stub_flasher"
    for sub in ("2", "1"):
        path = base / sub / f"{chip}.json"
        if path.is_file():
            stub = json.loads(path.read_text())
            return len(base64.b64decode(stub["text"])) + len(base64.b64decode(stub.get("data", "")))
    raise SystemExit(f"esptool has no stub for {chip}")


@dataclass
class Counts:
    """What one check moved and did, read from its result (the simulator's own counts)."""

    name: str
    regions: list[tuple[str, int, int]]  # (role, bytes written, compressed bytes) of written regions
    checked: int  # regions esptool verified (MD5) and skipped
    checked_bytes: int
    session: bool  # an esptool session ran
    boots: int
    link_down: int  # device -> host bytes, all variants
    link_up: int  # host -> device bytes, all variants
    invoke_us: dict[str, int]  # per variant
    inputs: int
    stages: dict[str, float]
    overlapped_reference: bool  # dataset mode: the host reference runs while the inputs stream

    @property
    def written(self) -> int:
        return sum(b for _, b, _ in self.regions)

    @property
    def compressed(self) -> int:
        return sum(c for _, _, c in self.regions)


def _flash_regions(res: Any, flash_file: Path) -> tuple[list[tuple[str, int, int]], int, int, bool]:
    """Written regions with their compressed size (zlib level 9, as esptool), checked-and-skipped ones."""
    flash = next((r.flash for r in res.variants.values() if r.flash), None)
    if not flash:
        return [], 0, 0, False
    image = flash_file.read_bytes()
    written, checked, checked_bytes = [], 0, 0
    for reg in flash["regions"]:
        if reg["skipped"]:
            checked += 1
            checked_bytes += reg["size"]
            continue
        data = image[reg["offset"] : reg["offset"] + reg["bytes_written"]]
        written.append((reg["role"], reg["bytes_written"], len(zlib.compress(data, 9))))
    return written, checked, checked_bytes, True


def _invokes(res: Any) -> tuple[dict[str, int], int]:
    ds = res.dataset
    if ds:
        rows = ds["analysis"]["rows"]
        return {v: sum(r["invoke_us"].get(v) or 0 for r in rows) for v in ("optimized", "ansi")}, len(rows)
    out = {}
    for v, run in res.variants.items():
        raw = Path(run.serial_log).read_bytes() if run.serial_log else b""
        out[v] = sum(int(m) for m in TIME_RE.findall(raw))
    return out, 1


def _link(res: Any, input_bytes: int) -> tuple[int, int]:
    """(device->host, host->device) bytes of the run's console link, both variants."""
    ds = res.dataset
    if ds:
        links = ds["link"].values()
        return sum(x["rx_bytes"] for x in links), sum(x["tx_bytes"] for x in links)
    down = sum(Path(r.serial_log).stat().st_size for r in res.variants.values() if r.serial_log)
    return down, input_bytes * len(res.variants)  # the input, streamed once per variant (+ a few frames)


def counts(name: str, res: Any, flash_file: Path, input_bytes: int) -> Counts:
    regions, checked, checked_bytes, session = _flash_regions(res, flash_file)
    invoke, n = _invokes(res)
    down, up = _link(res, input_bytes)
    boots = sum(1 for s in res.stages if s.stage in ("boot", "after-reset"))
    return Counts(
        name,
        regions,
        checked,
        checked_bytes,
        session,
        boots,
        down,
        up,
        invoke,
        n,
        stage_seconds(res),
        bool(res.dataset),
    )


def project(c: Counts, a: Assumptions, link_baud: int, flash_skipped: bool) -> dict[str, float]:
    """Seconds per stage on a real board."""
    session = flash = 0.0
    if c.session and not (flash_skipped and not c.regions):  # the skip applies when nothing is written
        session = a.connect_s + stub_bytes() * 10 / ROM_BAUD + c.checked_bytes / a.md5_bytes_per_s
        flash = c.compressed * 10 / (a.flash_baud * a.write_efficiency)
    boot = c.boots * (a.boot_s + (a.memtest_s if a.psram else 0.0))  # each variant starts once either way
    link = (c.link_down + c.link_up) * 10 / link_baud
    infer = sum(c.invoke_us.values()) / 1e6
    host = sum(v for k, v in c.stages.items() if k in HOST_STAGES)
    ref = c.stages.get("reference", 0.0)
    host += max(0.0, ref - link - infer) if c.overlapped_reference else ref  # what the stream did not hide
    return {
        "esptool session": session,
        "flash": flash,
        "boots": boot,
        "link": link,
        "inference": infer,
        "host": host,
    }


def _fmt(p: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in p.items()) + f"  = {sum(p.values()):.2f} s"


def simulate(tmp: Path, baud: int, n: int) -> dict[str, Counts]:
    """The scenarios on one simulated board throttled to ``baud`` (serial link and flash writes)."""
    flash_file = tmp / "flash.bin"
    port = f"sim://tm-{uuid.uuid4().hex[:6]}?throttle={baud}&invoke_time=model&flash={flash_file}"
    x = MODELS / "inputs" / "unet_mbv2_035_48.npy"
    in_bytes = int(np.prod(np.load(x).shape))  # int8 input tensor
    out: dict[str, Counts] = {}
    first = timed_run(tmp, "first", UNET48, [x], port, baud)[1]
    out["first run"] = counts("first run", first, flash_file, in_bytes)
    repeat = timed_run(tmp, "repeat", UNET48, [x], port, baud)[1]
    out["repeat check"] = counts("repeat check", repeat, flash_file, in_bytes)
    npz = tmp / "new.npz"
    rng = np.random.default_rng(25)
    np.savez(npz, x=rng.uniform(-1, 1, (n, 48, 48, 3)).astype(np.float32))
    ds = timed_run(tmp, "inputs", UNET48, [], port, baud, dataset=DatasetOptions(source=npz, results="full"))[
        1
    ]
    out[f"{n} new inputs"] = counts(f"{n} new inputs", ds, flash_file, in_bytes)
    out["_dataset_result"] = ds  # type: ignore[assignment]
    x64 = MODELS / "inputs" / "unet_mbv2_035_64.npy"
    new = timed_run(tmp, "new-model", UNET64, [x64], port, baud)[1]
    out["new model, same ops"] = counts(
        "new model, same ops", new, flash_file, int(np.prod(np.load(x64).shape))
    )
    return out


def check_against_sim(c: Counts, baud: int) -> str:
    """The byte-driven stages, projected at the simulator's rates, against its measured stages: the flash
    stage (the stub at the ROM baud, then the compressed images at ``baud``), and the console stages
    (boots, captures, the dataset stream: link bytes at ``baud`` plus the modelled invoke times)."""
    flash_proj = (stub_bytes() * 10 / ROM_BAUD if c.session else 0.0) + c.compressed * 10 / baud
    link_proj = (c.link_down + c.link_up) * 10 / baud + sum(c.invoke_us.values()) / 1e6
    console = ("boot", "capture", "dataset", "after-reset", "select-slot")
    link_meas = sum(c.stages.get(k, 0.0) for k in console)
    return (
        f"flash {flash_proj:.2f} s projected / {c.stages.get('flash', 0.0):.2f} s measured; "
        f"link + inference {link_proj:.2f} s projected / {link_meas:.2f} s measured"
    )


def chunks_figures(tmp: Path, baud: int, n: int, a: Assumptions, link_bauds: list[int]) -> None:
    """A dataset larger than the kept-input store (U-Net 48: 37 inputs), run with
    ``--keep-chunks never`` (the inputs beyond the store uploaded to both variants) and ``always`` (in
    chunks of the store: each input uploaded once, one slot switch more per chunk), on the simulator,
    projected onto a real S3 at each link baud. Two projections: the link time added to the inference
    (an upper bound: the time model's own rule) and overlapped with it per variant (a lower bound: the
    host streams the next inputs while the device runs the current one, with the 64 KiB window ~9 of
    them)."""
    npz = tmp / "chunks.npz"
    np.savez(npz, x=np.random.default_rng(26).uniform(-1, 1, (n, 48, 48, 3)).astype(np.float32))
    print(f"\n{n} new U-Net 48 inputs, a store of 37 (chunks of the store's size):")
    for policy in ("never", "always"):
        port = f"sim://tm-ch-{uuid.uuid4().hex[:6]}?throttle={baud}&invoke_time=model"
        opts = DatasetOptions(source=npz, results="full", chunks=policy)
        w, res = timed_run(tmp, f"chunks-{policy}", UNET48, [], port, baud, dataset=opts)
        ds = res.dataset or {}
        links = ds.get("link", {})
        invoke, _ = _invokes(res)
        boots = sum(1 for st in res.stages if st.stage == "boot")
        up = sum(x["tx_bytes"] for x in links.values())
        down = sum(x["rx_bytes"] for x in links.values())
        ch = ds.get("chunks", {})
        print(
            f"  --keep-chunks {policy}: {ch.get('parts')} part(s), {boots} boots, host->device {up} B, "
            f"device->host {down} B, simulator wall {w:.1f} s, verdict {res.verdict}"
        )
        for v, x in links.items():
            problems = [p for part in ds.get("passes", {}).get(v, []) for p in part["problems"]]
            print(
                f"    {v}: host->device {x['tx_bytes']} B, {x['kept_runs']} run from the store, "
                f"{x['kept_fallbacks']} not kept after all, {x['probes']} probes, "
                f"{x['retransmitted_frames']} re-run; problems {problems[:2]}"
            )
        print(f"    chunks: {ch}")
        for lb in link_bauds:
            boot = boots * a.boot_s
            infer = {v: invoke.get(v, 0) / 1e6 for v in links}
            link = {v: (x["tx_bytes"] + x["rx_bytes"]) * 10 / lb for v, x in links.items()}
            added = boot + sum(link.values()) + sum(infer.values())
            overlapped = boot + sum(max(link[v], infer[v]) for v in links)
            print(
                f"    real S3, link {lb}: link {sum(link.values()):.1f} s, boots {boot:.1f} s, inference "
                f"{sum(infer.values()):.1f} s: {added:.1f} s added / {overlapped:.1f} s overlapped"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baud", type=int, default=921600, help="the simulated board's throttle (both ways)")
    ap.add_argument("--n", type=int, default=100, help="new inputs streamed in the dataset scenario")
    ap.add_argument("--link-baud", type=int, nargs="+", default=[115200, 921600])
    ap.add_argument("--memtest-s", type=float, default=Assumptions.memtest_s)
    ap.add_argument("--boot-s", type=float, default=Assumptions.boot_s)
    ap.add_argument("--no-psram", action="store_true")
    ap.add_argument("--flash-skipped", action="store_true", help="model the HELLO flash skip (no esptool)")
    ap.add_argument("--chunks-only", action="store_true", help="only the dataset-in-chunks figures")
    args = ap.parse_args()
    a = Assumptions(memtest_s=args.memtest_s, boot_s=args.boot_s, psram=not args.no_psram)
    print(f"host: {os.cpu_count()} CPUs, load {os.getloadavg()}; simulated board at {args.baud} baud")
    print(f"assumptions: {a}; esptool stub {stub_bytes()} B uploaded at {ROM_BAUD} baud\n")
    if args.chunks_only:
        with tempfile.TemporaryDirectory() as d:
            chunks_figures(Path(d), args.baud, args.n, a, args.link_baud)
        print(f"load after: {os.getloadavg()}")
        return
    with tempfile.TemporaryDirectory() as d:
        scenarios = simulate(Path(d), args.baud, args.n)
    ds = scenarios.pop("_dataset_result")  # type: ignore[arg-type]
    for name, c in scenarios.items():
        print(
            f"{name}: {c.written} B written ({c.compressed} compressed) in {len(c.regions)} region(s) "
            f"{[r for r, _, _ in c.regions]}, {c.checked} region(s) verified and skipped, {c.boots} boots, "
            f"link {c.link_down} B down / {c.link_up} B up, invoke {c.invoke_us} us over {c.inputs} input(s)"
        )
        print(f"  simulator check at {args.baud} baud: {check_against_sim(c, args.baud)}")
        for lb in args.link_baud:
            for skipped in sorted({False, args.flash_skipped}):
                tag = f"link {lb}" + (", flash skipped" if skipped else "")
                print(f"  real S3 ({tag}): {_fmt(project(c, a, lb, skipped))}")
    goals(scenarios, ds, a, args)


def goals(scenarios: dict[str, Counts], ds: Any, a: Assumptions, args: argparse.Namespace) -> None:
    print("\nGoals:")
    rep = scenarios["repeat check"]
    after = dataclasses.replace(a, psram=False)  # the same board with the PSRAM memory test off
    for lb, skipped, aa, tag in (
        (115200, False, a, "today: console 115200, esptool session, memory test on"),
        (921600, False, a, "fast link 921600 only"),
        (921600, True, a, "fast link + flash skipped"),
        (921600, True, after, "fast link + flash skipped + memory test off"),
    ):
        total = sum(project(rep, aa, lb, skipped).values())
        print(f"  repeat check U-Net 48 on S3, {tag}: {total:.2f} s (goal <= 3 s)")
    new = scenarios[f"{args.n} new inputs"]
    ansi = new.invoke_us.get("ansi", 0) / 1e6
    for lb in args.link_baud:
        link = (new.link_down + new.link_up) * 10 / lb
        print(
            f"  {args.n} new inputs, link {lb}: link {link:.1f} s vs ANSI C inference {ansi:.1f} s "
            f"({'met' if link <= ansi else 'not met'}: goal link <= ANSI C inference)"
        )
    nm = scenarios["new model, same ops"]
    roles = [r for r, _, _ in nm.regions]
    print(
        f"  new model, same ops (U-Net 48 -> 64): regions written {roles} ({nm.written} B): "
        f"{'only the model' if roles == ['model'] else 'NOT only the model'}"
    )
    for v, link in (ds.dataset or {}).get("link", {}).items():
        per = link["bytes_per_input_device_to_host"]
        over = link["overhead_per_input_device_to_host"]
        print(
            f"  {args.n} new inputs, {v}: host->device {link['tx_bytes']} B, {link.get('kept_runs', 0)} "
            "inputs "
            f'run from the kept store (uploaded once per check: docs/protocol.md "Kept inputs")'
        )
        print(
            f"  device->host per input, {v}, --results full: {per:.1f} B = output + {over:.1f} B "
            f"(goal: output + 16; a RUN of 100 ms or more sends its result at once, with an ACK)"
        )
    print(
        "  host CPU per repeat CLI run: python bench/bench_host_cpu.py; runner 4 vs 1 boards, cold and warm: "
        "python bench/bench_soak.py --cold"
    )


if __name__ == "__main__":
    main()
