"""Resident firmware: the flash layout per board, flashing by hand, the simulated bootloader and app slots,
flow control under a slow device, the streaming faults, and what a repeat run writes.

What is faked: the board (harness.sim, the firmware's own C loop inside it) and, for the PlatformIO
script, the SCons environment PlatformIO hands to extra scripts (a recorder of ``env.Append``). esptool,
pyserial, the frame codec and the host client are the real ones.
"""

from __future__ import annotations

import json
import re
import struct
import time
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest
import serial
from sim_helpers import HANG_S, make_project

from harness.device.loop import LinkError, LoopClient
from harness.device.session import DeviceSession
from harness.errors import ExitCode, GenerateError
from harness.firmware.boards import list_boards, load_board
from harness.firmware.generate import FirmwareFeatures, generate_projects
from harness.firmware.layout import check_model_fits, flash_layout
from harness.flashfmt import otadata
from harness.flashfmt.model_image import HEADER_BYTES, parse_model_image
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.protocol import frames as fr
from harness.sim.board import get_board, remove_board
from harness.sim.image import build_sim_firmware

MODEL = "cnn_classifier_11.tflite"
INPUTS = ["inputs/cnn_classifier_11.png", "inputs/cnn_classifier_11__ambiguous.png"]


# ---- the flash layout, per board ------------------------------------------------------------------


@pytest.mark.parametrize("name", list_boards())
def test_partition_layout_per_board(name: str) -> None:
    board = load_board(name)
    lay = flash_layout(board)
    rows = {r.name: r for r in lay.rows}
    assert list(rows) == ["nvs", "otadata", "ota_0", "ota_1", "model"]
    assert lay.table_offset == board.partition_table_offset
    assert rows["nvs"].offset == board.partition_table_offset + 0x1000 and rows["nvs"].size >= 0x3000
    assert rows["otadata"].size == 0x2000
    assert rows["ota_0"].size == rows["ota_1"].size >= 0x80000
    assert all(r.offset % 0x10000 == 0 for r in (rows["ota_0"], rows["ota_1"], rows["model"]))
    end = board.partition_table_offset + 0xC00
    for r in lay.rows:  # in order, no overlap, inside the flash
        assert r.offset >= end and r.offset % 0x1000 == 0, r
        end = r.offset + r.size
    assert end == board.flash_bytes  # the model partition takes the rest
    assert 0 < lay.model_max_bytes <= rows["model"].size - HEADER_BYTES
    assert lay.model_max_bytes <= lay.mmap_window_bytes - lay.app_slot_bytes
    assert (
        lay.slot_offset("optimized") == rows["ota_0"].offset
        and lay.slot_offset("ansi") == rows["ota_1"].offset
    )


def test_a_model_too_large_for_the_board_is_refused_before_building(tmp_path: Path) -> None:
    from test_model_builder import padded_conv_model

    big = tmp_path / "big.tflite"
    big.write_bytes(padded_conv_model(h=4, w=4, c=512, oc=512))  # 2.4 MB of weights
    board = load_board("esp32-devkitc")  # 4 MB flash: models up to ~1.9 MB
    limit = flash_layout(board).model_max_bytes
    assert big.stat().st_size > limit
    with pytest.raises(GenerateError) as ei:
        generate_projects(
            big, [], board, out_dir=tmp_path / "p", features=FirmwareFeatures(embed_inputs=False)
        )
    msg = str(ei.value)
    assert f"takes models up to {limit} bytes" in msg and "esp32-devkitc" in msg and "model partition" in msg
    assert ei.value.exit_code == ExitCode.USAGE and not (tmp_path / "p").exists()
    # the ESP32's 4 MB data window limits a 16 MB board, however large its model partition
    import dataclasses

    wide = flash_layout(dataclasses.replace(board, flash_size="16MB"))
    assert wide.model_partition.size > 12 << 20 and wide.model_max_bytes == (3 << 20) - HEADER_BYTES
    with pytest.raises(GenerateError, match="maps at most 4 MB of flash for data"):
        check_model_fits(wide, 4 << 20, "m.tflite")


def test_pio_upload_flashes_the_model_partition_too(tmp_path: Path, models_dir: Path) -> None:
    """The generated PlatformIO extra script, run the way PlatformIO runs it (``pre:``, with its SCons
    environment): it adds the model image at the model partition's offset to FLASH_EXTRA_IMAGES."""
    (p,) = generate_projects(
        models_dir / MODEL, [], "esp32s3-devkitc-1-n8r8", out_dir=tmp_path, variants=("ansi",),
        features=FirmwareFeatures(embed_inputs=False),
    )  # fmt: skip
    ini = (p.path / "platformio.ini").read_text()
    assert "pre:esp-check/pio_flash_model.py" in ini

    class Env:
        def __init__(self) -> None:
            self.appended: dict[str, list] = {}

        def Append(self, **kw: list) -> None:
            for k, v in kw.items():
                self.appended.setdefault(k, []).extend(v)

    env = Env()
    script = (p.path / "esp-check" / "pio_flash_model.py").read_text()
    exec(compile(script, "pio_flash_model.py", "exec"), {"Import": lambda _name: None, "env": env})
    (offset, image) = env.appended["FLASH_EXTRA_IMAGES"][0]
    csv = (p.path / "partitions.csv").read_text()
    m = re.search(r"^model,\s+data,\s+0x40,\s+(0x[0-9A-F]+),", csv, re.M)
    assert m is not None and int(offset, 16) == int(m.group(1), 16)
    path = Path(image.replace("$PROJECT_DIR", str(p.path)))
    assert parse_model_image(path.read_bytes()).model == (models_dir / MODEL).read_bytes()


def test_otadata_is_esp_idfs() -> None:
    # esp_rom_crc32_le(UINT32_MAX, &seq, 4) for seq 1: 0x4743989A, the CRC of the well-known entry that
    # makes ESP-IDF's bootloader boot ota_0
    assert zlib.crc32(struct.pack("<I", 1), 0xFFFFFFFF) == 0x4743989A
    erased = b"\xff" * 0x2000
    assert otadata.selected_slot(erased, 2) is None
    data = erased
    for slot in (1, 0, 0, 1, 1):
        data = otadata.select(data, slot, 2)
        assert otadata.selected_slot(data, 2) == slot
    entry = data[:32] if data[:4] != b"\xff" * 4 else data[0x1000:0x1020]
    seq, crc = struct.unpack_from("<I", entry)[0], struct.unpack_from("<I", entry, 28)[0]
    assert crc == zlib.crc32(struct.pack("<I", seq), 0xFFFFFFFF)
    newest = 0x1000 if struct.unpack_from("<I", data, 0x1000)[0] > struct.unpack_from("<I", data, 0)[0] else 0
    damaged = bytearray(data)
    damaged[newest] ^= 1  # its CRC no longer matches: the older entry decides
    older = struct.unpack_from("<I", data, 0x1000 - newest)[0]
    assert otadata.selected_slot(bytes(damaged), 2) == (older - 1) % 2


# ---- the simulated board: slots, model partition ----------------------------------------------------


@pytest.fixture
def board_url():  # type: ignore[no-untyped-def]
    import harness.sim

    harness.sim.register()
    names: list[str] = []

    def make(extra: str = "") -> str:
        name = f"res-{uuid.uuid4().hex[:10]}"
        names.append(name)
        return f"sim://{name}?chip=esp32s3&emitter=c{extra}"

    yield make
    for n in names:
        remove_board(n)


def _images(tmp_path: Path, models_dir: Path) -> dict[str, list[tuple[int, Path]]]:
    """Both variants of the resident firmware (no compiled-in inputs), as the sim builder packs them."""
    return {
        v: build_sim_firmware(
            make_project(tmp_path / v, models_dir / MODEL, [], variant=v), tmp_path / f"b-{v}"
        )
        for v in ("optimized", "ansi")
    }


def _program_both(port: serial.SerialBase, images: dict) -> None:
    # the optimized build's files win where both have one: its otadata is erased (boots ota_0); the ANSI C
    # build's selects ota_1, so that flashing that build on its own boots it (docs/firmware.md)
    files = {off: p for v in ("ansi", "optimized") for off, p in images[v]}
    port.board.program(sorted(files.items()))  # type: ignore[attr-defined]


def _hello(dev: DeviceSession, log: Path, reset: bool = True) -> fr.Hello:
    cap = dev.boot(log, reset=reset, total_timeout=HANG_S, silence_timeout=HANG_S)
    assert cap.hello is not None, cap.data[-400:]
    return fr.decode_hello(cap.hello)


def test_bootloader_follows_otadata_and_the_app_switches_slots(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    images = _images(tmp_path, models_dir)
    url = board_url()
    with DeviceSession(url, load_board("sim")) as dev:
        _program_both(dev.serial, images)
        h = _hello(dev, tmp_path / "a.log")
        assert (h.nn, h.slot) == ("optimized", 0)  # empty otadata: ota_0
        cap = dev.switch_slot(h, 1, tmp_path / "b.log", seq=0, total_timeout=HANG_S, silence_timeout=HANG_S)
        h2 = fr.decode_hello(cap.hello or b"")
        assert (h2.nn, h2.slot) == ("ansi_c", 1) and b"OTA data selects ota_1" in cap.data
        assert _hello(dev, tmp_path / "c.log").nn == "ansi_c"  # a reset keeps the selection: it is in flash
        board = dev.serial.board  # type: ignore[union-attr]
        board.flash[0x120000:0x120010] = b"\xff" * 16  # the selected image damaged: the bootloader falls back
        cap = dev.boot(tmp_path / "d.log", reset=True, total_timeout=HANG_S, silence_timeout=HANG_S)
        assert (
            fr.decode_hello(cap.hello or b"").nn == "optimized"
            and b"ota_1 app partition is not bootable" in cap.data
        )


def test_a_slot_beyond_the_ota_apps_is_refused_as_the_firmware_refuses_it(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """A table with a factory app and ota_1 only: ota_1 holds a valid image, but no otadata sequence number
    selects it among one OTA app. ESP-IDF's esp_ota_set_boot_partition answers ESP_ERR_INVALID_ARG (0x102);
    the app sends a BOOTING with that status and keeps running, and so does the simulated app."""
    proj = make_project(tmp_path / "p", models_dir / MODEL, [], variant="ansi")
    table = (proj / "partitions.csv").read_text().replace("ota_0,    app,  ota_0", "factory,  app,  factory")
    (proj / "partitions.csv").write_text(table)
    files = build_sim_firmware(proj, tmp_path / "b")
    app = next(p for off, p in files if off == 0x20000)
    with DeviceSession(board_url(), load_board("sim")) as dev:
        board = dev.serial.board  # type: ignore[union-attr]
        board.program([*files, (0x120000, app)])
        before = bytes(board.flash[0x10000:0x12000])
        h = _hello(dev, tmp_path / "a.log")
        assert h.nn == "ansi_c"
        with pytest.raises(LinkError, match=r"refused to boot ota_1 next \(status 0x102\)"):
            dev.switch_slot(h, 1, tmp_path / "b.log", seq=0, total_timeout=HANG_S, silence_timeout=HANG_S)
        assert bytes(board.flash[0x10000:0x12000]) == before  # otadata untouched


def test_missing_model_partition_is_an_infrastructure_error(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    images = _images(tmp_path, models_dir)
    url = board_url()
    with DeviceSession(url, load_board("sim")) as dev:
        _program_both(dev.serial, images)
        dev.serial.board.flash[0x220000:0x220040] = b"\xff" * 64  # type: ignore[union-attr]
        cap = dev.boot(tmp_path / "a.log", reset=True, total_timeout=HANG_S, silence_timeout=HANG_S)
    h = fr.decode_hello(cap.hello or b"")
    assert h.init_stage == "model"
    from harness.analysis.classify import classify
    from harness.protocol.capture import parse_capture

    parsed = parse_capture(cap.data)
    assert [(e.stage, e.msg) for e in parsed.errors] == [
        ("model", "model_partition_holds_no_model_image_flash_it")
    ]
    kinds = {f.kind: f.exit_code for f in classify(cap.data, ended_by=cap.ended_by, parsed=parsed)}
    assert kinds == {"model_partition": ExitCode.INFRASTRUCTURE}


# ---- flow control under a slow device --------------------------------------------------------------


def _stream(
    url: str, tmp_path: Path, models_dir: Path, respect_window: bool
) -> tuple[dict, LoopClient, object]:
    images = _images(tmp_path, models_dir)
    results: dict[int, fr.ResultRecord] = {}
    with DeviceSession(url, load_board("sim")) as dev:
        _program_both(dev.serial, images)
        h = _hello(dev, tmp_path / "s.log")
        board = dev.serial.board  # type: ignore[union-attr]
        with open(tmp_path / "s.log", "ab") as log:
            c = dev.client(h, log, stall_timeout=5, ack_timeout=1, respect_window=respect_window)
            rng = np.random.default_rng(1)
            try:
                for i in range(12):  # 12 x 3 KB inputs + commands: more than twice the 16 KB window
                    c.load(rng.integers(-128, 128, h.input_bytes, dtype=np.int8).tobytes())
                    c.send(fr.CMD_RUN, fr.encode_run(i, results=fr.RES_CRC))
                c.sync(7)
            except LinkError:
                pass
            for f in c.inbox:
                if f.type == fr.RSP_RESULT:
                    for r in fr.decode_results(f.payload, h.output_bytes):
                        results[r.ident] = r
    return results, c, board


def test_flow_control_never_overruns_a_slow_device(tmp_path: Path, models_dir: Path, board_url) -> None:
    url = board_url("&invoke_time=0.05&throttle=921600")  # busy 50 ms per invoke, a 921600 baud link
    t0 = time.monotonic()
    results, client, board = _stream(url, tmp_path, models_dir, respect_window=True)
    assert sorted(results) == list(range(12)) and all(r.status == fr.ST_OK for r in results.values())
    assert board.rx_dropped == 0 and client.stats.clean  # type: ignore[attr-defined]
    assert client.stats.tx_payload == 12 * 3072
    assert time.monotonic() - t0 >= 12 * 0.05  # the device really was busy


def test_a_host_ignoring_flow_control_loses_bytes_and_never_gets_a_clean_run(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    url = board_url("&invoke_time=0.05")
    _results, client, board = _stream(url, tmp_path, models_dir, respect_window=False)
    assert board.rx_dropped > 0  # type: ignore[attr-defined]
    assert not client.stats.clean  # NAKs and retransmissions (or a link failure): never a clean match


# ---- streaming faults and bytes written, through flash-and-compare -----------------------------------


def _fc(models_dir: Path, out: Path, port: str, inputs: list[str] = INPUTS):  # type: ignore[no-untyped-def]
    return flash_and_compare(
        models_dir / MODEL,
        [models_dir / i for i in inputs],
        board="sim",
        port=port,
        out_dir=out,
        options=JobOptions(timeouts=StageTimeouts(capture_total=40, capture_silence=4)),
    )


@pytest.mark.parametrize(
    "fault",
    # the stall waits out the host's ack timeout (5 s on 2 busy cores): the full suite only
    [
        "frame_rx&frame_every=3",
        "frame_tx&frame_every=2",
        pytest.param("stall&fault_count=1", marks=pytest.mark.slow),
    ],
)
def test_streaming_faults_never_match(tmp_path: Path, models_dir: Path, board_url, fault: str) -> None:
    result = _fc(models_dir, tmp_path / "out", board_url(f"&fault={fault}&variant_fault=ansi"))
    assert result.exit_code == ExitCode.INFRASTRUCTURE, result.errors
    doc = json.loads(result.report_path.read_text())
    assert doc["verdict"] != "match"
    ansi = result.variants["ansi"]
    if fault.startswith("stall"):
        assert ansi.source is None  # nothing complete came back
    else:  # the repairs are named: in the session, or at the baud switch when the damage hit it (no round
        # trip at either baud: that boot's link failed, the variant is an infrastructure error)
        switch = [st.detail for st in result.stages if st.stage == "link-baud" and st.variant == "ansi"]
        repaired = any(f["kind"] == "link_repair" for f in ansi.findings)
        assert repaired or any(d.startswith("no SYNC round trip") for d in switch), (ansi.findings, switch)
    assert result.variants["optimized"].exit_code is None  # the clean variant stays clean


def _link_stages(report: Path, variant: str) -> list[dict]:  # type: ignore[type-arg]
    """The failed ``link`` stages report.json records for ``variant``."""
    stages = json.loads(report.read_text())["stages"]
    return [s for s in stages if (s["stage"], s["variant"], s["status"]) == ("link", variant, "failed")]


def test_a_link_that_needed_repairs_is_a_failed_stage(tmp_path: Path, models_dir: Path, board_url) -> None:
    """Every 4th frame the ansi app receives is damaged: the link needs repairs, so the variant is an
    infrastructure error (exit 3) though every other stage passed. The report names the stage that
    failed it (``link``, with the repairs), as every other failure does. Faked: the board (sim://)."""
    result = _fc(models_dir, tmp_path / "out", board_url("&fault=frame_rx&frame_every=4&variant_fault=ansi"))
    assert result.exit_code == ExitCode.INFRASTRUCTURE, result.errors
    assert any(f["kind"] == "link_repair" for f in result.variants["ansi"].findings)
    (link,) = _link_stages(result.report_path, "ansi")
    assert link["exit_code"] == ExitCode.INFRASTRUCTURE, link
    assert link["detail"].startswith("the serial link needed repairs: "), link
    assert not _link_stages(result.report_path, "optimized")


@pytest.mark.slow
def test_repeat_run_and_new_inputs_write_nothing(tmp_path: Path, models_dir: Path, board_url) -> None:
    url = board_url("&flash_size=8MB")
    first = _fc(models_dir, tmp_path / "a", url)
    assert first.exit_code == ExitCode.MATCH, first.errors
    flash = first.variants["optimized"].flash
    assert flash is not None and flash["bytes_written"] > 0
    for out, inputs in (("b", INPUTS), ("c", INPUTS[1:])):  # the same run again; another input only
        again = _fc(models_dir, tmp_path / out, url, inputs)
        assert again.exit_code == ExitCode.MATCH, again.errors
        facts = again.variants["ansi"].flash
        assert facts is not None and facts["bytes_written"] == 0
        assert all(r["skipped"] for r in facts["regions"])
        assert {r["role"] for r in facts["regions"]} == {"bootloader", "partition-table", "model", "app"}


# ---- no esptool session when the board already holds the builds (HELLO hashes) ---------------------


def _app_bytes(images: dict, variant: str) -> bytes:
    off = 0x20000 if variant == "optimized" else 0x120000
    return next(p for o, p in images[variant] if o == off).read_bytes()


def test_hello_reports_both_app_slots_as_esp_idf_hashes_them(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """ESP-IDF's esp_partition_get_sha256 of an app slot is the image's appended SHA-256 (the SHA-256 of
    the image before it), checked against the image: zeros in HELLO when the slot holds no valid image."""
    import hashlib

    from harness.protocol.app_image import slot_sha256

    images = _images(tmp_path, models_dir)
    opt, ansi = _app_bytes(images, "optimized"), _app_bytes(images, "ansi")
    with DeviceSession(board_url(), load_board("sim")) as dev:
        _program_both(dev.serial, images)
        h = _hello(dev, tmp_path / "a.log")
        assert (h.slot, h.app_sha256, h.other_sha256) == (0, opt[-32:].hex(), ansi[-32:].hex())
        assert h.app_sha256 == hashlib.sha256(opt[:-32]).hexdigest() == slot_sha256(opt, "esp32s3")
        assert h.other_sha256 == slot_sha256(ansi, "esp32s3") != h.app_sha256
        dev.serial.board.flash[0x120000 + 0x40] ^= 0x01  # type: ignore[union-attr]  # ota_1 damaged
        h = _hello(dev, tmp_path / "b.log")
    assert h.app_sha256 == slot_sha256(opt, "esp32s3") and h.other_sha256 == ""


def test_slot_sha256_follows_esp_idf_for_every_kind_of_slot(tmp_path: Path, models_dir: Path) -> None:
    import hashlib

    from harness.protocol.app_image import slot_sha256

    app = _app_bytes(_images(tmp_path, models_dir), "optimized")
    assert app[23] == 1  # hash_appended in the extended header
    plain = bytearray(app[:-32])
    plain[23] = 0  # no appended hash: ESP-IDF hashes the image (header .. checksum padding)
    assert slot_sha256(bytes(plain) + b"\xff" * 64, "esp32s3") == hashlib.sha256(plain).hexdigest()
    damaged = bytearray(app)
    damaged[0x40] ^= 1
    assert slot_sha256(bytes(damaged), "esp32s3") == ""  # ESP_ERR_IMAGE_INVALID
    assert slot_sha256(app[:100], "esp32s3") == ""  # truncated: no image
    program = b"\x7fELF" + bytes(range(256))  # a native board's slot holds a host program: its own hash
    assert slot_sha256(program, "esp32") == hashlib.sha256(program).hexdigest()


def test_images_differ_names_every_hash_that_is_not_the_builds(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    import dataclasses

    from harness.firmware.build import Artifact, BuildResult
    from harness.flows.resident import images_differ

    images = _images(tmp_path, models_dir)
    builds = {
        v: BuildResult(tmp_path, "sim", tuple(Artifact(off, p, "app") for off, p in images[v]
                                              if off in (0x20000, 0x120000)),
                       tmp_path / "x.bin", tmp_path / "f.json", None, False, "k", "s", "esp32s3")
        for v in ("optimized", "ansi")
    }  # fmt: skip
    with DeviceSession(board_url(), load_board("sim")) as dev:
        _program_both(dev.serial, images)
        h = _hello(dev, tmp_path / "a.log")
    model = h.model_sha256
    assert images_differ(h, builds, model) == []
    other_model = "ab" * 32
    cases = {
        "model": (h, other_model),
        "ota_0": (dataclasses.replace(h, app_sha256="cd" * 32), model),
        "ota_1": (dataclasses.replace(h, other_sha256=""), model),  # zeros: firmware that does not report
        "slot": (dataclasses.replace(h, slot=1), model),
        "start-up": (dataclasses.replace(h, init_status=3), model),
    }
    for what, (hello, m) in cases.items():
        why = images_differ(hello, builds, m)
        assert why, what
    assert images_differ(None, builds, model) and images_differ(h, builds, "")
    ansi_only = {"ansi": builds["ansi"]}  # a single build: the other slot must still be it
    assert images_differ(h, ansi_only, model) == []
    assert images_differ(dataclasses.replace(h, other_sha256=h.app_sha256), ansi_only, model)


def test_a_board_holding_the_builds_is_not_flashed(tmp_path: Path, models_dir: Path, board_url) -> None:
    from harness.flows.resident import FLASH_SKIPPED

    url = board_url("&flash_size=8MB")
    first = _fc(models_dir, tmp_path / "a", url)
    board = get_board(url.split("//")[1].split("?")[0])
    assert first.exit_code == ExitCode.MATCH and "skipped" not in (first.variants["ansi"].flash or {})
    sessions = board.download_sessions
    again = _fc(models_dir, tmp_path / "b", url)
    assert again.exit_code == ExitCode.MATCH, again.errors
    facts = again.variants["ansi"].flash or {}
    assert facts.get("skipped") == FLASH_SKIPPED and facts["bytes_written"] == 0
    assert board.download_sessions == sessions  # no esptool session at all
    log = (tmp_path / "b" / "logs" / "serial-ansi.log").read_bytes()  # the probe's boot opens its log
    assert b"@ECH HELLO" in log and b"Loaded app from partition at offset 0x120000" in log
    board.flash[0x120000 + 0x40] ^= 0x01  # the ANSI C app in ota_1 damaged: its hash no longer matches
    third = _fc(models_dir, tmp_path / "c", url)
    assert third.exit_code == ExitCode.MATCH, third.errors
    facts = third.variants["ansi"].flash or {}
    assert "skipped" not in facts and board.download_sessions == sessions + 1
    written = [(r["role"], r["variant"]) for r in facts["regions"] if r["bytes_written"]]
    assert written == [("app", "ansi")]


def _one_variant_builds(tmp_path: Path, models_dir: Path, ops: list[tuple[int, ...]]) -> list:
    """The optimized build with compiled-in inputs and ``ops`` on ANSI C, one per entry (as hybrid's runs)."""
    from harness.firmware.build import build_project

    builds = []
    for k, ansi in enumerate(ops):
        (project,) = generate_projects(
            models_dir / MODEL, [models_dir / INPUTS[0]], load_board("sim"), out_dir=tmp_path / f"p{k}",
            variants=("optimized",), features=FirmwareFeatures(ansi_ops=ansi),
        )  # fmt: skip
        builds.append(build_project(project.path, cache_dir=tmp_path / "cache"))
    return builds


@pytest.mark.slow
def test_a_probe_stops_at_another_builds_elf_hash_and_a_failed_start_boots_once(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """A board holding another build of the slot (one that runs its compiled-in input into a hang, so it
    never prints HELLO): the probe before flashing stops at the app's "ELF file SHA256" line, which is
    not the new build's, instead of waiting out the silence; after the flash, the app's failed start-up
    (INPUT, then silence) is judged from its one boot, not booted into the same hang a second time.
    Faked: the board (a hang after INPUT in the optimized kernels); real: generate, the sim builder,
    esptool, the console capture, the judge."""
    from harness.flows.capture import flash_and_capture
    from harness.flows.resident import app_elf_sha256
    from harness.flows.targets import open_target

    url = board_url("&fault=hang&variant_fault=optimized")
    target = open_target(load_board("sim"), url)
    old, new = _one_variant_builds(tmp_path, models_dir, [(1,), (2,)])
    limits = StageTimeouts(capture_total=30, capture_silence=2)
    for build, out in ((old, tmp_path / "a"), (new, tmp_path / "b")):
        run, stages = flash_and_capture(build, target, out, variant="optimized", timeouts=limits)
        assert run.exit_code == ExitCode.INFRASTRUCTURE, run.problems  # silence without evidence
        assert [s.stage for s in stages].count("boot") == 1, stages
        log = (out / "logs" / "serial-optimized.log").read_bytes()
        assert log.count(b"ESP-ROM:") == 1 and log.count(b" INPUT i=0 ") == 1
        printed = re.findall(rb"ELF file SHA256:\s+([0-9a-f]+)", log)
        assert len(printed) == 1 and app_elf_sha256(build).startswith(printed[0].decode())
    probe = (tmp_path / "b" / "logs" / "boot-probe.log").read_bytes()
    old_sha = app_elf_sha256(old)
    assert old_sha != app_elf_sha256(new) and f"ELF file SHA256:  {old_sha[:9]}".encode() in probe
    assert b"@EC1" not in probe and b"INPUT" not in probe  # stopped before the app's own output
    flash = next(s for s in stages if s.stage == "flash")
    assert f"prints ELF SHA-256 {old_sha[:9]}..., not the optimized build's" in flash.detail, flash


# ---- a model change writes only the model partition (the arena travels in its header) ---------------


def test_a_model_with_the_same_ops_rewrites_only_the_model_partition(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """U-Net 48 -> 64: the same ops, another arena. The arena size is in the model partition's header,
    not in the apps, so the second run writes the model partition and nothing else; both still match."""
    url = board_url("&flash_size=8MB")
    runs = {}
    for m in ("48", "64"):
        runs[m] = flash_and_compare(
            models_dir / f"unet_mbv2_035_{m}.tflite",
            [models_dir / f"inputs/unet_mbv2_035_{m}.png"],
            board="sim",
            port=url,
            out_dir=tmp_path / m,
            options=JobOptions(timeouts=StageTimeouts(capture_total=60, capture_silence=6)),
        )
        assert runs[m].exit_code == ExitCode.MATCH, runs[m].errors
    image = "projects/ansi/esp-check/partitions/model.bin"
    arenas = {m: parse_model_image((tmp_path / m / image).read_bytes()).arena_bytes for m in runs}
    assert arenas["48"] != arenas["64"] and min(arenas.values()) > 0
    facts = runs["64"].variants["ansi"].flash or {}
    written = [(r["role"], r["variant"]) for r in facts["regions"] if r["bytes_written"]]
    assert written == [("model", None)], facts["regions"]
    log = (tmp_path / "64" / "logs" / "serial-ansi.log").read_bytes()
    assert f"size={arenas['64']} ".encode() in log  # ARENA: the app allocated what the header gives


def test_an_arena_the_board_cannot_give_is_refused_at_start_up(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """A model partition header asking for more arena than the board offers: the app stops at start-up with
    an ERROR (stage alloc) naming both sizes, before allocating anything."""
    from harness.flashfmt.model_image import pack_model_image

    limits = {"internal": 320 * 1024, "psram": 7 * 1024 * 1024}  # the generator's, for an 8 MB PSRAM board
    images = {
        v: build_sim_firmware(
            make_project(tmp_path / v, models_dir / MODEL, [], variant=v, arena_max=limits),
            tmp_path / f"b-{v}",
        )
        for v in ("optimized", "ansi")
    }
    model = (models_dir / MODEL).read_bytes()
    big = tmp_path / "big-model.bin"
    big.write_bytes(pack_model_image(model, 64 * 1024 * 1024, "psram"))
    with DeviceSession(board_url(), load_board("sim")) as dev:
        _program_both(dev.serial, images)
        dev.serial.board.program([(0x220000, big)])  # type: ignore[union-attr]
        cap = dev.boot(tmp_path / "a.log", reset=True, total_timeout=HANG_S, silence_timeout=HANG_S)
    h = fr.decode_hello(cap.hello or b"")
    assert h.init_stage == "alloc"
    from harness.protocol.capture import parse_capture

    (err,) = parse_capture(cap.data).errors
    assert (
        err.stage == "alloc" and err.msg == f"arena_{64 * 1024 * 1024}_bytes_above_the_boards_{7 << 20}_psram"
    )


# ---- the fast link: BAUD after HELLO, verified by a round trip, else the console baud ----------------


def _stage(result, name: str) -> list[tuple[str | None, str]]:  # type: ignore[no-untyped-def]
    return [(s.variant, s.detail) for s in result.stages if s.stage == name]


def test_the_resident_loop_runs_at_the_link_baud_after_hello(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """The board's console is 115200 (boards/sim.toml); after each HELLO the host asks for the board's
    link_baud (921600), the device answers at 115200 and switches, a SYNC round trip at 921600 confirms it,
    and the text session streams at 921600. The throttled line carries each byte at its own baud."""
    url = board_url("&flash_size=8MB&throttle=921600")
    result = _fc(models_dir, tmp_path / "a", url)
    assert result.exit_code == ExitCode.MATCH, result.errors
    assert {d for _, d in _stage(result, "link-baud")} == {"921600 baud (console 115200, asked 921600)"}
    board = get_board(url.split("//")[1].split("?")[0])
    assert sum("console 115200 -> 921600 baud" in line for line in board.log) == 2  # each variant's boot
    assert board._rate(115200) == 11520.0 and board._rate(921600) == 92160.0  # 10 bits a byte, per baud


def test_a_link_that_cannot_carry_the_fast_baud_falls_back_to_the_console_baud(
    tmp_path: Path, models_dir: Path, board_url
) -> None:
    """The line garbles what the host sends above 115200 (fault baud_fail: a bridge that cannot do it):
    the SYNC at 921600 never arrives, the device goes back to 115200 by itself, the host follows, and the
    run is the same clean match at the console baud."""
    url = board_url("&flash_size=8MB&fault=baud_fail")
    result = _fc(models_dir, tmp_path / "a", url, INPUTS[:1])
    assert result.exit_code == ExitCode.MATCH, result.errors
    assert {d for _, d in _stage(result, "link-baud")} == {"115200 baud (console 115200, asked 921600)"}
    board = get_board(url.split("//")[1].split("?")[0])
    assert any("back to 115200" in line for line in board.log)


def test_usb_serial_jtag_consoles_keep_their_own_speed(tmp_path: Path, models_dir: Path) -> None:
    import harness.sim

    harness.sim.register()
    name = f"res-{uuid.uuid4().hex[:10]}"
    try:
        result = flash_and_compare(
            models_dir / MODEL,
            [models_dir / INPUTS[0]],
            board="sim-usbjtag",
            port=f"sim://{name}?reset=usb_jtag",
            out_dir=tmp_path / "a",
            options=JobOptions(timeouts=StageTimeouts(capture_total=40, capture_silence=4)),
        )
    finally:
        remove_board(name)
    assert result.exit_code == ExitCode.MATCH, result.errors
    assert _stage(result, "link-baud") == []
