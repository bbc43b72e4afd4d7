"""Booting a flashed sim image: ROM + bootloader + IDF log + the protocol stream (parsed by the real
parser), the model's outputs from the host TFLM reference, baud-rate honesty, persistence.

Faked: the board (harness.sim). The protocol bytes come from the firmware's C emitter (ctypes).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import hard_reset
from pydantic import TypeAdapter, ValidationError
from sim_helpers import make_project, read_until_end

import harness.sim as sim
from harness.device.ports import open_port, resolve_port
from harness.errors import PortError, UsageError
from harness.flashfmt.model_image import pack_model_image
from harness.protocol.capture import parse_capture
from harness.runner.plan import Name
from harness.sim.board import SimBoard, parse_url, remove_board
from harness.sim.image import build_sim_firmware

sim.register()
pytestmark = pytest.mark.needs_cc


def _files(tmp: Path, models_dir: Path, variant: str, chip: str = "esp32s3", **manifest: object):
    x = np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy")
    y = np.load(models_dir / "inputs" / "cnn_classifier_11__ambiguous.q.npy")
    proj = make_project(
        tmp / f"proj-{variant}-{chip}",
        models_dir / "cnn_classifier_11.tflite",
        [x, y],
        variant=variant,
        chip=chip,
        **manifest,
    )
    return build_sim_firmware(proj, tmp / f"build-{variant}-{chip}")


@pytest.fixture
def board_port() -> Iterator:
    opened: list[tuple[serial.SerialBase, str]] = []

    def _open(chip: str = "esp32s3", extra: str = "", name: str | None = None, baud: int = 115200):
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        port = serial.serial_for_url(f"sim://{name}?chip={chip}&emitter=c{extra}", baudrate=baud, timeout=0.2)
        opened.append((port, name))
        return port

    yield _open
    for port, name in opened:
        port.close()
        remove_board(name)


def boot(port: serial.SerialBase) -> bytes:
    """Reset the board and read its console until END or silence (the simulated board's output is finite:
    ``loops`` boots of a boot loop); read_until_end's bound, sim_helpers.HANG_S, only catches a hang."""
    port.dtr = False  # IO0 high (with DTR and RTS both active, EN cannot be pulled low)
    hard_reset(port, hold_delay=0.01)
    return read_until_end(port)


@pytest.mark.parametrize(("variant", "nn"), [("optimized", "optimized"), ("ansi", "ansi_c")])
def test_app_boot_prints_valid_protocol_stream(
    tmp_path: Path, models_dir: Path, board_port, variant: str, nn: str
) -> None:
    port = board_port("esp32s3")
    port.board.program(_files(tmp_path, models_dir, variant))
    raw = boot(port)
    assert b"esp-check SIMULATED BOARD" in raw
    assert b"I (" in raw and b"main_task: Calling app_main()" in raw
    cap = parse_capture(raw)
    assert cap.valid, cap.problems
    assert cap.simulated and cap.begin["sim"] == "1"
    assert cap.nn_mode == nn  # from the image's compiled-in variant
    assert cap.info["chip"] == "esp32s3" and cap.info["inputs"] == "2"
    assert "sim_fault" not in cap.info
    expected = [
        np.load(models_dir / "expected" / "cnn_classifier_11.out0.npy"),
        np.load(models_dir / "expected" / "cnn_classifier_11__ambiguous.out0.npy"),
    ]
    assert len(cap.runs) == 2
    for run, exp in zip(cap.runs, expected, strict=True):
        assert np.array_equal(run.outputs[0].data.reshape(exp.shape), exp)


def test_bootloader_finds_the_table_where_the_board_put_it(
    tmp_path: Path, models_dir: Path, board_port
) -> None:
    """The partition table offset is board data: the simulated bootloader carries it (as a real one has
    CONFIG_PARTITION_TABLE_OFFSET compiled in) and boots from a table at 0x9000 as well as 0xc000."""
    files = _files(tmp_path, models_dir, "ansi", board_def={"partition_table_offset": 0x9000})
    assert [off for off, _ in files][1] == 0x9000
    port = board_port("esp32s3")
    port.board.program(files)
    raw = boot(port)
    assert b"Partition Table:" in raw and parse_capture(raw).valid
    # a bootloader that looks for its table where there is none stops like ESP-IDF's does
    port.board.program([(0x9000, _erased(tmp_path))])
    raw = boot(port)
    assert b"load partition table error!" in raw and b"@EC1" not in raw


def _erased(tmp_path: Path) -> Path:
    blank = tmp_path / "blank.bin"
    blank.write_bytes(b"\xff" * 0x1000)
    return blank


def test_rom_banner_at_115200_console_faster(tmp_path: Path, models_dir: Path, board_port) -> None:
    """The ROM prints at 115200 even when the app's console runs at 921600 (honest baud model)."""
    name = f"baud-{uuid.uuid4().hex[:8]}"
    files = _files(tmp_path, models_dir, "optimized", chip="esp32", console_baud=921600)
    fast = board_port("esp32", name=name, baud=921600)
    fast.board.program(files)
    raw = boot(fast)
    assert b"ets Jun  8 2016" not in raw and b"rst:0x1" not in raw  # banner arrives as garbage
    assert parse_capture(raw).valid
    fast.baudrate = 115200
    raw_slow = boot(fast)
    assert b"ets Jun  8 2016 00:22:57" in raw_slow and b"rst:0x1 (POWERON_RESET)" in raw_slow
    assert b"@EC1" not in raw_slow  # ... and now the app's output is the garbage
    assert not parse_capture(raw_slow).valid


def test_empty_flash_boot_loops_on_invalid_header(board_port) -> None:
    port = board_port("esp32s3")
    raw = boot(port)
    assert raw.count(b"invalid header: 0xffffffff") >= 2
    assert b"@EC1" not in raw


def test_flash_survives_reopen_and_registry_and_file(tmp_path: Path, models_dir: Path, board_port) -> None:
    files = _files(tmp_path, models_dir, "ansi")
    name = f"persist-{uuid.uuid4().hex[:8]}"
    flash_file = tmp_path / "flash.bin"
    port = board_port("esp32s3", extra=f"&flash={flash_file}", name=name)
    port.board.program(files)
    port.close()
    port.open()  # same board: flash kept in the registry
    assert parse_capture(boot(port)).nn_mode == "ansi_c"
    port.close()
    remove_board(name)  # board gone from this process; its flash file remains
    assert flash_file.stat().st_size == 4 << 20
    again = board_port("esp32s3", extra=f"&flash={flash_file}", name=name)
    board: SimBoard = again.board
    assert board.boots == 0  # a new board object ...
    assert parse_capture(boot(again)).nn_mode == "ansi_c"  # ... booting the persisted image


def test_two_names_are_two_boards(tmp_path: Path, models_dir: Path, board_port) -> None:
    a = board_port("esp32s3")
    b = board_port("esp32s3")
    a.board.program(_files(tmp_path, models_dir, "optimized"))
    assert parse_capture(boot(a)).valid
    assert b"invalid header" in boot(b)


def test_bad_urls_are_rejected() -> None:
    for url in (
        "sim://x?chip=esp8266",
        "sim://x?reset=weird",
        "sim://x?fault=melt",
        "sim://bad name",
        "sim://x?chip=esp32&reset=usb_jtag",
        "sim://x?colour=red",
    ):
        with pytest.raises(serial.SerialException):
            serial.serial_for_url(url)


def test_reopen_inherits_hardware_and_rejects_conflicts() -> None:
    name = f"re-{uuid.uuid4().hex[:8]}"
    try:
        serial.serial_for_url(f"sim://{name}?chip=esp32c3&reset=usb_jtag").close()
        port = serial.serial_for_url(f"sim://{name}")  # no parameters: the existing board
        assert (port.board.chip.name, port.board.config.reset) == ("esp32c3", "usb_jtag")
        port.close()
        with pytest.raises(serial.SerialException, match="chip=esp32s3"):
            serial.serial_for_url(f"sim://{name}?chip=esp32s3")
    finally:
        remove_board(name)


def test_board_files_and_url_for() -> None:
    from harness.firmware.boards import load_board

    for board_name in ("sim", "sim-usbjtag"):
        board = load_board(board_name)
        url = board.default_port
        _name, config = sim.parse_url(url)
        assert config.chip.name == board.chip and config.flash_size == 8 << 20
        assert config.reset == ("usb_jtag" if board.reset == "usb_serial_jtag" else "classic")
    url = sim.url_for("x1", {"chip": "esp32", "fault": "corrupt", "variant_fault": "optimized", "seed": 4})
    _, config = sim.parse_url(url)
    assert config.faults.names == {"corrupt"}
    assert (config.faults.variant, config.faults.seed) == ("optimized", 4)
    with pytest.raises(UsageError, match="unknown simulator parameter"):
        sim.url_for("x1", {"colour": "red"})


@pytest.mark.parametrize(("board_mb", "outcome"), [(4, "probe_failed"), (8, "runs"), (16, "larger_warning")])
def test_flash_size_in_the_image_header_is_checked_at_start_up(
    tmp_path: Path, models_dir: Path, board_port, board_mb: int, outcome: str
) -> None:
    """An image built for 8 MB on a chip with less flash: ESP-IDF's start-up refuses it and the board
    boot-loops, as on hardware ("Detected size(4096k) smaller than the size in the binary image header")."""
    from harness.analysis.classify import classify

    board_def = {"flash_size": "8MB", "partition_table_offset": 0xC000}
    files = _files(tmp_path, models_dir, "optimized", board_def=board_def)
    port = board_port("esp32s3", extra=f"&flash_size={board_mb}MB")
    port.board.program(files)
    raw = boot(port)
    assert b"SPI Flash Size : 8MB" in raw  # the 2nd-stage bootloader reads its own header
    if outcome == "probe_failed":
        assert raw.count(b"E (") >= 3 and b"@EC1" not in raw
        assert (
            raw.count(
                b"spi_flash: Detected size(4096k) smaller than the size in the binary image "
                b"header(8192k). Probe failed."
            )
            == 3
        )
        assert raw.count(b"assert failed: do_core_init startup.c:328 (flash_ret == ESP_OK)") == 3
        from harness.analysis.classify import exit_code_for

        findings = classify(raw, ended_by="silence")
        kinds = {f.kind for f in findings}
        assert "flash_size_mismatch" in kinds and "boot_loop" in kinds, kinds
        # the start-up assert is the mismatch's consequence: a wrong board file (2), not a crash (4)
        assert "abort" not in kinds and exit_code_for(findings) == 2
        mismatch = next(f for f in findings if f.kind == "flash_size_mismatch")
        assert mismatch.details["chip_kb"] == 4096 and mismatch.details["image_kb"] == 8192
    else:
        assert parse_capture(raw).valid
        warned = b"Detected size(16384k) larger than the size in the binary image header(8192k)" in raw
        assert warned == (outcome == "larger_warning")


# The app's first line leaves the simulated board about 0.1 s after EN rises (ROM banner, then the
# bootloader's log at 115200). The scenario holds only if the host switched its baud before that.
_APP_STARTS_AFTER = 0.09


def _reset_then_switch(port, read_early: bool) -> tuple[bytes, bytes]:
    """Hard-reset at 921600, take what is on the wire ~35 ms later (or nothing, a slow reader), switch to
    115200 and read to the END record. A host descheduled past the app's start (a loaded machine) did
    not run the scenario: it is redone, up to five times, and the test is skipped if it never was."""
    for _ in range(5):
        port.baudrate = 921600
        port.reset_input_buffer()
        hard_reset(port, hold_delay=0.01)
        reset_at = time.monotonic()
        time.sleep(0.035)  # EN's RC delay (strap_window, 20 ms), then the ROM prints at once
        early = port.read(port.in_waiting) if read_early else b""  # a reader thread at 921600
        port.baudrate = 115200
        switched_after = time.monotonic() - reset_at
        rest = read_until_end(port)
        if switched_after < _APP_STARTS_AFTER:
            return early, rest
    pytest.skip(f"the host never switched baud within {_APP_STARTS_AFTER} s of the reset (machine loaded)")


def test_boot_output_takes_time_and_is_received_at_the_hosts_baud_of_that_moment(
    tmp_path: Path, models_dir: Path, board_port
) -> None:
    """esptool hard-resets with the port still at 921600 and a client (pytest-embedded) switches to the
    console's 115200 only afterwards. On hardware the ROM banner, sent at once, is received as garbage;
    the app, which starts printing ~0.1 s later, is read cleanly. Bytes already received stay garbage."""
    port = board_port("esp32s3", baud=921600)
    port.board.program(_files(tmp_path, models_dir, "optimized"))
    port.dtr = False
    early, rest = _reset_then_switch(port, read_early=True)
    assert early and b"ESP-ROM" not in early + rest and b"rst:0x1" not in early + rest  # banner: garbage
    assert b"@EC1" not in early  # the app had not started yet
    cap = parse_capture(rest)
    assert cap.valid, cap.problems
    assert b"main_task: Calling app_main()" in rest

    # a slow reader: nothing read until after the switch; the banner still arrived at 921600
    _, late = _reset_then_switch(port, read_early=False)
    assert b"ESP-ROM" not in late and parse_capture(late).valid


def _split_axis_out_of_range_model() -> bytes:
    """input int8 [1,4] -> SPLIT along constant axis 5 -> [1,4]: it allocates, and TFLM's Invoke fails on
    every input (SplitEval TF_LITE_ENSUREs the axis, split.cc:94-95: it returns an error, it does not
    abort). A GATHER index past its axis did this before; esp-tflite-micro 1.3.8 reads past the input
    there instead (gather.cc:85-93) and the loader refuses it."""
    import tflite
    from test_model_builder import Op, T, build_model

    q = {"scale": 0.05, "zero_point": 0}
    tensors = [
        T("axis", (1,), "int32", data=np.array([5], dtype=np.int32)),
        T("input", (1, 4), "int8", **q),
        T("output", (1, 4), "int8", **q),
    ]
    return build_model(tensors, [Op(tflite.BuiltinOperator.SPLIT, [0, 1], [2])], [1], [2])


@pytest.mark.parametrize(
    ("input_bytes", "stage", "code", "i", "msg"),
    [
        (4, "invoke", 1, 0, "Invoke_failed"),  # TFLM's Invoke fails on the compiled-in input
        (6, "input", 4, None, "input_tensor_size_differs_from_embedded_input"),  # refused at start-up
    ],
)
def test_a_compiled_in_input_the_app_cannot_run_prints_the_firmwares_error_record(
    tmp_path: Path, board_port, input_bytes: int, stage: str, code: int, i: int | None, msg: str
) -> None:
    """app_main.cc's BootText: an Invoke that fails prints ERROR stage=invoke for that input and END
    status=error; Setup refuses an embedded input whose size is not the model's input tensor's (stage
    input, code: the tensor's bytes). The simulated app prints the same records instead of raising."""
    proj = make_project(tmp_path / "proj", _split_axis_out_of_range_model(), [bytes(input_bytes)])
    port = board_port("esp32s3")
    port.board.program(build_sim_firmware(proj, tmp_path / "build"))
    cap = parse_capture(boot(port))
    assert cap.end_status == "error" and all(not run.outputs for run in cap.runs)
    assert [(e.stage, e.code, e.i, e.msg) for e in cap.errors] == [(stage, code, i, msg)]
    assert port.board.mode == "app"  # the board still runs its app: nothing was raised inside it


@pytest.mark.parametrize(
    ("dtype", "shape", "code"),
    [
        ("bool", (1, 4), 6),
        ("float16", (1, 4), 10),
        ("int64", (4,), 4),
    ],  # TfLiteType: float16 is 1 in the schema
)
def test_an_output_no_record_carries_fails_the_start_up_as_the_firmwares_setup(
    tmp_path: Path, board_port, dtype: str, shape: tuple[int, ...], code: int
) -> None:
    """app_main.cc's Setup checks every output before any input runs: a type no TENSOR record carries is
    ``ERROR stage=output code=<TfLiteType> msg=unsupported_output_tensor`` and END status=error, with no
    INPUT (a project the generator would refuse; made by hand). Faked: the board (``sim://``)."""
    import tflite
    from test_model_builder import Op, T, build_model

    tensors = [T("input", (1, 4), "int8", scale=0.05), T("out", shape, dtype)]
    model = build_model(tensors, [Op(tflite.BuiltinOperator.CAST, [0], [1])], [0], [1])
    proj = make_project(tmp_path / "proj", model, [np.array([[1, 7, 3, 2]], np.int8)] * 2)
    port = board_port("esp32s3")
    port.board.program(build_sim_firmware(proj, tmp_path / "build"))
    cap = parse_capture(boot(port))
    assert cap.end_status == "error" and not cap.runs, cap.problems
    assert [(e.stage, e.code, e.i, e.msg) for e in cap.errors] == [
        ("output", code, None, "unsupported_output_tensor")
    ]
    assert cap.valid, cap.problems


def test_every_dtype_the_loader_can_name_has_a_tflite_type_code() -> None:
    """The board's Setup refusal above looks the output's TfLiteType code up by dtype name; the loader
    names a tensor's dtype from the ``tflite`` package's TensorType and refuses any other code (loader
    ``_tensor_info``). A ``tflite`` release with a newer schema type (INT2: TensorType 19, kTfLiteInt2 = 20)
    would reach that lookup with a name it lacks: this says so before the board raises ValueError."""
    import tflite

    from harness.model.loader import enum_names
    from harness.sim.resident import _TFLITE_TYPES

    assert {n.lower() for n in enum_names(tflite.TensorType).values()} <= set(_TFLITE_TYPES.split())


_MODEL_AT, _MODEL_SIZE = 0x220000, 0x1E0000  # the model partition of sim_helpers.PARTITIONS_4MB
_NO_IMAGE = "model_partition_holds_no_model_image_flash_it"
_DAMAGED = "model_partition_damaged_sha256_differs"
_NO_ARENA = "model_image_gives_no_arena_size_flash_the_model_again"


@pytest.mark.parametrize(
    ("at", "data", "msg"),
    [
        (0, b"\xff" * 64, _NO_IMAGE),  # erased: no magic
        (48, b"\0\0\0\0", _NO_IMAGE),  # the header's CRC: MapModel's first check, as a missing magic
        (0, pack_model_image(bytes(_MODEL_SIZE))[:64], _NO_IMAGE),  # announces more than the partition
        (64 + 100, b"\x55", _DAMAGED),  # a model byte: the SHA-256 differs
        (60, b"\0\0\0\0", _NO_ARENA),  # the arena fields' CRC
        # that CRC and model bytes, both bad: MapModel checks the arena before the SHA-256
        (60, b"\0" * 105, _NO_ARENA),
    ],
)
def test_a_bad_model_partition_prints_the_firmwares_model_error(
    tmp_path: Path, models_dir: Path, board_port, at: int, data: bytes, msg: str
) -> None:
    """app_main.cc's MapModel: a header that fails its checks (magic, size field, CRC, length) is no model
    image; then a bad arena CRC gives no arena; then model bytes whose SHA-256 is not the header's are a
    damaged partition. Faked: the board."""
    port = board_port("esp32s3")
    port.board.program(_files(tmp_path, models_dir, "optimized"))
    port.board.flash[_MODEL_AT + at : _MODEL_AT + at + len(data)] = data
    cap = parse_capture(boot(port))
    assert [(e.stage, e.msg) for e in cap.errors] == [("model", msg)]
    assert cap.end_status == "error" and cap.valid, cap.problems


def test_a_kernel_that_aborts_is_the_simulated_chips_abort_not_the_end_of_the_process(
    tmp_path: Path, board_port
) -> None:
    """TFLM's softmax aborts (TFLITE_CHECK -> SIGABRT) on a long row near its maximum: on a chip that is
    abort(), a crash report and a reboot. The simulated chip runs TFLM's kernels in a child process, so
    it prints the same and boots again; the process serving the board (here: pytest) lives on."""
    from native_fixture import write_refused_input, write_refused_model

    pytest.importorskip("tflite_micro")
    model = write_refused_model(tmp_path / "softmax.tflite")
    proj = make_project(tmp_path / "proj", model, [np.load(write_refused_input(tmp_path / "flat.npy"))])
    port = board_port("esp32s3")
    port.board.program(build_sim_firmware(proj, tmp_path / "build"))
    raw = boot(port)
    assert raw.count(b"abort() was called at PC") >= 2 and b"Rebooting..." in raw  # on every boot
    assert b" INPUT i=0 " in raw and b" TENSOR " not in raw


def _reshape_to_scalar_model() -> bytes:
    """input int8 [1] -> RESHAPE -> "scalar" declared [0], and QUANTIZE (scale 0.05 -> 0.1) -> "half" [1].
    TFLM's reshape turns a declared shape [0] into a scalar (one element) at AllocateTensors, so the first
    output holds one byte at run time where the flatbuffer declares none."""
    import tflite
    from test_model_builder import Op, T, build_model

    tensors = [
        T("input", (1,), "int8", scale=0.05),
        T("scalar", (0,), "int8", scale=0.05),
        T("half", (1,), "int8", scale=0.1),
    ]
    ops = [Op(tflite.BuiltinOperator.RESHAPE, [0], [1]), Op(tflite.BuiltinOperator.QUANTIZE, [0], [2])]
    return build_model(tensors, ops, [0], [1, 2])


def test_an_output_larger_at_run_time_than_declared_leaves_the_next_outputs_alone(
    tmp_path: Path, board_port
) -> None:
    """The simulated CPU (TFLM in a child process) cuts each output to its declared size, so an output TFLM
    made larger at run time never shifts the ones after it. (The real firmware does not run this model:
    TFLM's reshape writes into the read-only mapped model; docs/simulator.md, "Not reproduced".)
    Faked: the board (``sim://``)."""
    pytest.importorskip("tflite_micro")
    proj = make_project(tmp_path / "proj", _reshape_to_scalar_model(), [np.array([40], np.int8)])
    port = board_port("esp32s3")
    port.board.program(build_sim_firmware(proj, tmp_path / "build"))
    cap = parse_capture(boot(port))
    assert cap.end_status == "ok" and not cap.errors
    scalar, half = cap.runs[0].outputs
    assert scalar.data.size == 0 and half.data.tolist() == [20]  # 40 * 0.05 / 0.1


@pytest.mark.parametrize("name", ["a", "a" * 64, "a" * 65, "-a", ".a", "_a", "a.b-c_D9", "a b", "a!b", "é"])
def test_a_simulated_boards_name_follows_the_plans_name_rule(name: str) -> None:
    """``sim://NAME`` and a plan's job and board names are one rule (harness.inprocess.NAME_RE): a name
    one accepts the other does too, and the sim's refusal keeps its message."""
    plan_ok = True
    try:
        TypeAdapter(Name).validate_python(name)
    except ValidationError:
        plan_ok = False
    if plan_ok:
        assert parse_url(f"sim://{name}")[0] == name
    else:
        with pytest.raises(UsageError, match="bad simulated board name") as err:
            parse_url(f"sim://{name}")
        assert err.value.hint == "use letters, digits, '.', '_' and '-' (max 64)"


@pytest.mark.parametrize("url", ["sim://be\nnch", "sim://bench\n?chip=esp32", "sim://bench?chip=es\tp32"])
def test_a_sim_url_with_a_line_break_or_tab_is_refused(url: str) -> None:
    """urlsplit drops tabs and line breaks anywhere in a URL, so ``sim://be\\nnch`` opened the board
    ``bench``: a name the user did not type. ``--port`` as esp-check opens it (resolve_port strips only
    the URL's ends). Faked: nothing (a simulated board of this process)."""
    with pytest.raises(UsageError, match="tab or line break"):
        parse_url(url)
    with pytest.raises(PortError, match="tab or line break"):
        open_port(resolve_port(url)).close()


def test_a_model_tflm_cannot_allocate_fails_the_start_up_as_the_firmwares_setup(
    tmp_path: Path, board_port
) -> None:
    """input int8 [1] -> RESHAPE with a shape tensor [0] -> output declared [0]: TFLM's reshape Prepare
    finds 0 output elements for 1 input element, so on a chip AllocateTensors fails and app_main.cc's
    Setup prints ``ERROR stage=alloc code=1 msg=AllocateTensors_failed`` (1: kTfLiteError) and END
    status=error, with no INPUT; the simulated app asks its TFLM child (the same kernels) and prints the
    same, not an Invoke of a model that never allocated. Faked: the board (``sim://``)."""
    import tflite
    from test_model_builder import Op, T, build_model

    tensors = [
        T("input", (1,), "int8", scale=0.05),
        T("empty", (0,), "int8", scale=0.05),
        T("shape", (1,), "int32", data=np.array([0], np.int32)),
    ]
    model = build_model(tensors, [Op(tflite.BuiltinOperator.RESHAPE, [0, 2], [1])], [0], [1])
    proj = make_project(tmp_path / "proj", model, [bytes(1)])
    port = board_port("esp32s3")
    port.board.program(build_sim_firmware(proj, tmp_path / "build"))
    cap = parse_capture(boot(port))
    assert [(e.stage, e.code, e.i, e.msg) for e in cap.errors] == [
        ("alloc", 1, None, "AllocateTensors_failed")
    ]
    assert cap.end_status == "error" and not cap.runs, cap.problems
    assert cap.valid, cap.problems
