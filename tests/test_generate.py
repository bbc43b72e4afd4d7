"""Rendering the firmware projects: every board x variant x fixture model, checked with the ecosystem's own
parsers (PlatformIO's ProjectConfig, YAML, CSV) and against the sdkconfig allow-list.

No ESP-IDF here, so the C++ is not compiled against IDF/TFLM; the parts that need neither (model and input
arrays, the protocol emitter copy) are compiled with the host compiler in test_generate_compile.py.
"""

from __future__ import annotations

import csv
import filecmp
import json
import re
from dataclasses import replace
from pathlib import Path

import jinja2
import numpy as np
import pytest
import yaml

from harness import resources
from harness.cli import main
from harness.errors import ExitCode, GenerateError
from harness.firmware import generate as gen
from harness.firmware.boards import list_boards, load_board
from harness.flashfmt.model_image import parse_model_image
from harness.model.inputs import load_input
from harness.model.loader import load_model
from harness.model.opdata import resolver_methods
from harness.resources import data_dir, parse_toml, templates_dir

MODELS = Path(__file__).parent / "data" / "models"
INPUTS = MODELS / "inputs"
# Arena sizes for the matrix (host TFLM arena from tests/data/models/README.md plus headroom), so the
# matrix does not run the TFLM arena probe 40 times. The estimator itself is exercised below.
FIXTURES = {
    "cnn_classifier_11": 50,
    "op_zoo": 16,
    "unet_mbv2_035_48": 220,
    "unet_mbv2_035_64": 350,
    "unet_mbv2_035_128": 1300,
}
BOARDS = [b.name for b in list_boards()]
ALLOW = parse_toml((data_dir() / "sdkconfig_allowlist.toml").read_text(encoding="utf-8"))


def _input(model: str) -> Path:
    png = INPUTS / f"{model}.png"
    return png if png.exists() else INPUTS / f"{model}.npy"


def _sdkconfig_lines(path: Path) -> dict[str, str | None]:
    """Symbols of an sdkconfig.defaults: value, or None for '# CONFIG_X is not set'."""
    out: dict[str, str | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^# (CONFIG_[A-Z0-9_]+) is not set$", line)
        if m:
            out[m.group(1)] = None
            continue
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        assert re.match(r"^CONFIG_[A-Z0-9_]+$", key), f"malformed line {line!r} in {path}"
        assert value, f"empty value in {line!r}"
        assert key not in out, f"{key} set twice in {path}"
        out[key] = value
    return out


def _hex_bytes(text: str, start: str) -> bytes:
    """Bytes of the C initializer that follows ``start`` in ``text``."""
    body = text[text.index(start) :]
    body = body[body.index("{") + 1 : body.index("};")]
    return bytes(int(tok, 16) for tok in re.findall(r"0x[0-9a-f]{2}", body))


def _check_project(p: gen.GeneratedProject, model_name: str) -> None:
    board = p.board
    root = p.path
    manifest = json.loads((root / "esp-check.json").read_text(encoding="utf-8"))
    assert manifest["variant"] == p.variant and manifest["board"] == board.name
    assert manifest["chip"] == board.chip

    # --- sdkconfig.defaults against the allow-list
    sdk = _sdkconfig_lines(root / "sdkconfig.defaults")
    for key in sdk:
        assert key in ALLOW["symbols"], f"{key} is not in the allow-list ({board.name})"
        assert key not in ALLOW["forbidden"], key
        chips = ALLOW["symbols"][key].get("chips")
        if chips is not None:
            assert board.chip in chips, f"{key} does not exist for {board.chip}"
    wanted, other = ("CONFIG_NN_OPTIMIZED", "CONFIG_NN_ANSI_C")[:: 1 if p.variant == "optimized" else -1]
    assert sdk[wanted] == "y" and other not in sdk
    assert sdk["CONFIG_IDF_TARGET"] == f'"{board.chip}"'
    assert sdk[f"CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_{board.cpu_mhz}"] == "y"
    assert sdk[f"CONFIG_ESPTOOLPY_FLASHSIZE_{board.flash_size}"] == "y"
    assert [k for k in sdk if k.startswith("CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_")] == [
        f"CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_{board.cpu_mhz}"
    ]
    assert sdk["CONFIG_ESP_TASK_WDT_INIT"] == "y" and int(sdk["CONFIG_ESP_TASK_WDT_TIMEOUT_S"] or 0) >= 10
    assert sdk["CONFIG_ESP_TASK_WDT_CHECK_IDLE_TASK_CPU0"] is None  # Invoke runs on CPU0
    assert int(sdk["CONFIG_ESP_MAIN_TASK_STACK_SIZE"] or 0) >= 8192
    assert (sdk.get("CONFIG_SPIRAM") == "y") == board.has_psram
    mode = {
        "octal": "CONFIG_SPIRAM_MODE_OCT",
        "quad": "CONFIG_SPIRAM_MODE_QUAD",
        "hex": "CONFIG_SPIRAM_MODE_HEX",
    }
    if board.has_psram and board.chip != "esp32":  # the ESP32's PSRAM has no mode choice in Kconfig
        assert sdk[mode[board.psram]] == "y"
    elif board.has_psram:
        assert not any(k.startswith("CONFIG_SPIRAM_MODE_") for k in sdk)
    if board.has_psram:  # ESP-IDF runs the PSRAM memory test at every boot unless told not to
        assert sdk["CONFIG_SPIRAM_MEMTEST"] == ("y" if board.psram_memtest else None)
    else:
        assert "CONFIG_SPIRAM_MEMTEST" not in sdk
    if board.console == "uart" and board.monitor_baud == 115200:  # ESP-IDF's default console and baud
        assert sdk["CONFIG_ESP_CONSOLE_UART_DEFAULT"] == "y" and "CONFIG_ESP_CONSOLE_UART_BAUDRATE" not in sdk
    elif board.console == "uart":
        assert sdk["CONFIG_ESP_CONSOLE_UART_CUSTOM"] == "y"
        assert sdk["CONFIG_ESP_CONSOLE_UART_BAUDRATE"] == str(board.monitor_baud)
    else:
        assert sdk["CONFIG_ESP_CONSOLE_USB_SERIAL_JTAG"] == "y"
    for key, value in board.sdkconfig.items():
        assert sdk[key] == (None if value == "n" else value)  # "n" is written as "# KEY is not set"
    assert sdk["CONFIG_PARTITION_TABLE_OFFSET"] == f"{board.partition_table_offset:#x}"

    # --- platformio.ini, read by PlatformIO itself (no network)
    if board.pio_board:
        from platformio import fs
        from platformio.project.config import ProjectConfig

        cfg = ProjectConfig(str(root / "platformio.ini"))
        assert cfg.validate(["esp_check"], silent=True)
        with fs.cd(
            str(root)
        ):  # PlatformIO resolves directories relative to the project, as `pio run -d` does
            assert Path(cfg.get("platformio", "src_dir")) == (root / "main").resolve()
        env = "env:esp_check"
        assert cfg.get(env, "platform") == "espressif32 @ 6.13.0"
        assert cfg.get(env, "framework") == ["espidf"]
        assert cfg.get(env, "board") == board.pio_board
        assert cfg.get(env, "monitor_speed") == board.monitor_baud
        assert cfg.get(env, "upload_speed") == board.flash_baud
        assert cfg.get(env, "board_build.partitions") == "partitions.csv"
        assert cfg.get(env, "extra_scripts") == [
            "pre:esp-check/pio_flash_model.py",
            "post:esp-check/pio_boot_slot.py",
        ]
    else:
        assert not (root / "platformio.ini").exists()

    # --- idf_component.yml: pinned exactly; the ESP-IDF range is the board's supported one
    comp = yaml.safe_load((root / "main" / "idf_component.yml").read_text(encoding="utf-8"))
    deps = comp["dependencies"]
    assert deps["espressif/esp-tflite-micro"]["version"] == "==1.3.8"
    assert deps["espressif/esp-nn"]["version"] == "==1.1.2"
    low, below = board.idf_range
    assert deps["idf"]["version"] == f">={low},<{below}"
    assert manifest["versions"]["esp-idf-supported"] == deps["idf"]["version"]

    # --- partitions.csv: parsed as CSV; app partition fits the model and the flash
    rows = [
        [c.strip() for c in r]
        for r in csv.reader((root / "partitions.csv").read_text(encoding="utf-8").splitlines())
        if r and not r[0].startswith("#")
    ]
    parts = {r[0]: (r[1], r[2], int(r[3], 0), int(r[4], 0)) for r in rows}
    # two app slots (optimized ota_0, ANSI C ota_1), otadata, the model in its own data partition
    assert [(k, v[:2]) for k, v in parts.items()] == [("nvs", ("data", "nvs")), ("otadata", ("data", "ota")),
        ("ota_0", ("app", "ota_0")), ("ota_1", ("app", "ota_1")), ("model", ("data", "0x40"))]  # fmt: skip
    assert parts["ota_0"][3] == parts["ota_1"][3] >= 0x100000 and parts["ota_0"][2] % 0x10000 == 0
    image = (root / "esp-check" / "partitions" / "model.bin").read_bytes()
    assert parse_model_image(image).model == (MODELS / f"{model_name}.tflite").read_bytes()
    assert parts["model"][3] >= len(image)
    # the table moved above ESP-IDF's 0x8000 (bootloader headroom, most of all on the P4 at 0x2000);
    # nvs starts right after it with at least ESP-IDF's documented minimum of 0x3000 bytes
    assert board.partition_table_offset == 0xC000
    assert parts["nvs"][:2] == ("data", "nvs") and parts["nvs"][2] >= 0xD000 and parts["nvs"][3] >= 0x3000
    end = board.partition_table_offset + 0xC00  # the table itself
    for _, (_, _, off, size) in sorted(parts.items(), key=lambda kv: kv[1][2]):
        assert off >= end and off % 0x1000 == 0
        end = off + size
    assert end <= board.flash_bytes

    # --- CMake: the sources the component lists exist
    cm = (root / "main" / "CMakeLists.txt").read_text(encoding="utf-8")
    for src in re.findall(r'"([A-Za-z_]+\.(?:c|cc))"', cm):
        assert (root / "main" / src).is_file(), src
    assert "include($ENV{IDF_PATH}/tools/cmake/project.cmake)" in (root / "CMakeLists.txt").read_text()

    # --- the app: resolver, arena, embedded data
    app = (root / "main" / "app_main.cc").read_text(encoding="utf-8")
    rendered = re.findall(r"resolver\.(Add\w+)\(\)", app)
    info = load_model(MODELS / f"{model_name}.tflite")
    assert rendered == list(resolver_methods(info))
    assert "MicroMutableOpResolver<kNumOps>" in app and f"kNumOps = {len(rendered)};" in app
    # the arena travels with the model (its partition header), the app has only the board's limits
    image = parse_model_image((root / "esp-check" / "partitions" / "model.bin").read_bytes())
    assert (image.arena_bytes, image.arena_mem) == (p.arena_bytes, p.arena_mem)
    assert "kArenaBytes" not in app and f"kArenaMaxInternal = {board.internal_ram_arena_kb * 1024};" in app
    assert not (root / "main" / "model_data.cc").exists()  # the model is not compiled into the app
    header = (root / "main" / "model_data.h").read_text(encoding="utf-8")
    assert 'kEspCheckModelPartition = "model"' in header and "kEspCheckModelSubtype = 0x40" in header
    assert (root / "esp-check" / "model.tflite").read_bytes() == (
        MODELS / f"{model_name}.tflite"
    ).read_bytes()
    # the emitter is a verbatim copy
    for name in gen.PROTO_FILES:
        assert filecmp.cmp(root / "main" / name, templates_dir() / "common" / name, shallow=False)


@pytest.mark.slow
@pytest.mark.parametrize("model_name", list(FIXTURES))
def test_every_board_and_variant_renders(model_name: str, tmp_path: Path) -> None:
    generated = 0
    for board_name in BOARDS:
        board = load_board(board_name)
        try:
            projects = gen.generate_projects(
                MODELS / f"{model_name}.tflite",
                [_input(model_name)],
                board,
                out_dir=tmp_path / board_name,
                arena_kb=FIXTURES[model_name],
            )
        except GenerateError as exc:
            # only ever because the arena fits nowhere on this board, and it must say so
            assert "tensor arena" in str(exc) and board.name in str(exc)
            assert FIXTURES[model_name] > board.internal_ram_arena_kb
            continue
        assert [p.variant for p in projects] == ["optimized", "ansi"]
        for p in projects:
            _check_project(p, model_name)
        generated += 1
    assert generated >= 4  # PSRAM boards take even the 128x128 U-Net


@pytest.mark.parametrize(
    ("model_name", "board_name", "expected"),
    [
        ("unet_mbv2_035_128", "esp32-devkitc", None),
        ("unet_mbv2_035_128", "esp32s3-devkitc-1-n8", None),
        ("unet_mbv2_035_128", "esp32s3-devkitc-1-n8r2", "psram"),
        ("unet_mbv2_035_128", "esp32s3-devkitc-1-n8r8", "psram"),
        ("unet_mbv2_035_48", "esp32c3-devkitm-1", None),
        ("unet_mbv2_035_48", "esp32s3-devkitc-1-n8", "internal"),
        ("cnn_classifier_11", "esp32-devkitc", "internal"),
    ],
)
def test_arena_placement(model_name: str, board_name: str, expected: str | None) -> None:
    board = load_board(board_name)
    arena = FIXTURES[model_name] * 1024
    if expected is None:
        with pytest.raises(GenerateError, match="tensor arena needs") as ei:
            gen.place_arena(arena, board)
        assert ei.value.hint and "PSRAM" in ei.value.hint
    else:
        assert gen.place_arena(arena, board) == expected


def test_variants_differ_only_in_nn_setting_and_manifest(tmp_path: Path) -> None:
    opt, ansi = gen.generate_projects(
        MODELS / "op_zoo.tflite",
        [INPUTS / "op_zoo.npy"],
        "esp32s3-devkitc-1-n8r8",
        out_dir=tmp_path,
        arena_kb=16,
    )
    cmp = filecmp.dircmp(opt.path, ansi.path)
    differing: list[str] = []

    def walk(d: filecmp.dircmp[str], prefix: str = "") -> None:
        assert not d.left_only and not d.right_only
        differing.extend(prefix + f for f in d.diff_files)
        for name, sub in d.subdirs.items():
            walk(sub, prefix + name + "/")

    walk(cmp)
    assert sorted(differing) == ["esp-check.json", "sdkconfig.defaults"]
    a = (opt.path / "sdkconfig.defaults").read_text().splitlines()
    b = (ansi.path / "sdkconfig.defaults").read_text().splitlines()
    changed = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert len(a) == len(b) and changed == [("CONFIG_NN_OPTIMIZED=y", "CONFIG_NN_ANSI_C=y")]
    ma = json.loads((opt.path / "esp-check.json").read_text())
    mb = json.loads((ansi.path / "esp-check.json").read_text())
    keys = {k for k in ma if ma[k] != mb[k]}
    assert keys == {"variant", "nn_config", "nn_expected", "files"}


def test_resolver_matches_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for model_name in ("op_zoo", "cnn_classifier_11", "unet_mbv2_035_48"):
        assert main(["inspect", str(MODELS / f"{model_name}.tflite"), "--json", "--no-arena"]) == 0
        inspected = json.loads(capsys.readouterr().out)["resolver"]["methods"]
        (p,) = gen.generate_projects(
            MODELS / f"{model_name}.tflite",
            [_input(model_name)],
            "sim",
            out_dir=tmp_path / model_name,
            variants=("ansi",),
            arena_kb=FIXTURES[model_name],
        )
        app = (p.path / "main" / "app_main.cc").read_text()
        assert re.findall(r"resolver\.(Add\w+)\(\)", app) == inspected
        assert len(set(inspected)) == len(inspected)  # each op registered once
        assert json.loads(p.manifest_path.read_text())["resolver"] == inspected


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    args = (MODELS / "cnn_classifier_11.tflite", [INPUTS / "cnn_classifier_11.png"], "esp32c3-devkitm-1")
    (a,) = gen.generate_projects(*args, out_dir=tmp_path / "one", variants=("optimized",), arena_kb=50)
    (b,) = gen.generate_projects(
        *args, out_dir=tmp_path / "two" / "deeper", variants=("optimized",), arena_kb=50
    )
    assert a.files == b.files
    for rel in (*a.files, "esp-check.json"):
        assert (a.path / rel).read_bytes() == (b.path / rel).read_bytes(), rel


def test_k_inputs_embedded_in_order(tmp_path: Path) -> None:
    model = MODELS / "cnn_classifier_11.tflite"
    inputs = [
        INPUTS / "cnn_classifier_11.png",
        INPUTS / "cnn_classifier_11__ambiguous.npy",
        INPUTS / "cnn_classifier_11.q.npy",
    ]
    (p,) = gen.generate_projects(model, inputs, "sim", out_dir=tmp_path, variants=("optimized",), arena_kb=50)
    text = (p.path / "main" / "inputs_data.cc").read_text()
    header = (p.path / "main" / "model_data.h").read_text()
    assert "kEspCheckNumInputs = 3;" in header
    manifest = json.loads(p.manifest_path.read_text())
    tensor = load_model(model).inputs[0]
    for k, path in enumerate(inputs):
        expected = load_input(path, tensor).quantized.tobytes()
        embedded = _hex_bytes(text, f"k_input_{k}[]")
        assert embedded == expected
        assert (p.path / "esp-check" / f"input_{k}.bin").read_bytes() == expected
        assert manifest["inputs"][k]["sha256"] == load_input(path, tensor).sha256
        assert manifest["inputs"][k]["source_name"] == path.name
    assert "k_input_0,\n    k_input_1,\n    k_input_2," in text


HOSTILE = [
    '"; system("reboot"); //',
    "*/ #include <evil.h> /*",
    "line\nbreak\r\n#define X",
    "??/ trigraph \\",
    "ünïcødé name",
    "",
    "x" * 500,
    "@EC1 0 BEGIN *DEADBEEF",
]


def test_hostile_names_are_sanitized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.model.loader as model_mod

    real = model_mod.load_model

    def hostile_model(path: str | Path) -> model_mod.ModelInfo:
        info = real(path)
        outs = tuple(replace(t, name=HOSTILE[k % len(HOSTILE)]) for k, t in enumerate(info.outputs))
        ins = tuple(replace(t, name=HOSTILE[1]) for t in info.inputs)
        return replace(info, outputs=outs, inputs=ins)

    monkeypatch.setattr(gen, "load_model", hostile_model)
    # file names reach C comments too: quotes, '*', backslash and a newline are legal in POSIX file names
    model = tmp_path / 'm*"\n\\.tflite'
    model.write_bytes((MODELS / "op_zoo.tflite").read_bytes())
    inp = tmp_path / 'in *\\ "x".npy'
    inp.write_bytes((INPUTS / "op_zoo.npy").read_bytes())
    (p,) = gen.generate_projects(
        model, [inp], "sim", out_dir=tmp_path / "out", variants=("ansi",), arena_kb=16
    )
    app = (p.path / "main" / "app_main.cc").read_text()
    names_block = app[app.index("kOutputNames[kNumOutputs] = {") : app.index("};", app.index("kOutputNames"))]
    literals = re.findall(r'"([^"]*)"', names_block)
    assert len(literals) == 2
    for lit in literals:
        assert re.fullmatch(r"[A-Za-z0-9_.:/-]{1,64}", lit), lit
    assert literals[1] == "*/ #include <evil.h> /*".replace("*", "_").replace(" ", "_").replace(
        "#", "_"
    ).replace("<", "_").replace(">", "_")
    for rel in p.files:
        if rel.endswith((".cc", ".h", ".txt", ".ini", ".csv", ".yml", "defaults")) and "proto" not in rel:
            text = (p.path / rel).read_text()
            for bad in ("system(", "#include <evil", "*/ #", '"x"', "??/", "\\\n"):
                assert bad not in text, (rel, bad)
            # a comment line can never be closed early or broken
            for line in text.splitlines():
                if line.lstrip().startswith("//"):
                    assert "*/" not in line
    manifest = json.loads(p.manifest_path.read_text())
    assert all(re.fullmatch(r"[A-Za-z0-9_.:/-]+", o["name"]) for o in manifest["outputs"])


def test_c_str_sanitizer() -> None:
    assert gen.c_str("conv2d/BiasAdd:0") == "conv2d/BiasAdd:0"
    assert gen.c_str("") == "-"
    assert gen.c_str('a"b\\c*d?e\n') == "a_b_c_d_e_"
    assert len(gen.c_str("y" * 1000)) == 64


def test_strict_undefined_in_templates() -> None:
    env = gen._environment()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ not_defined }}").render()
    # every template renders only with a complete context: drop one key and rendering must fail
    tmpl = env.get_template("main/app_main.cc.j2")
    with pytest.raises(jinja2.UndefinedError):
        tmpl.render({"banner": "x"})


def test_version_overrides_and_validation(tmp_path: Path) -> None:
    (p,) = gen.generate_projects(
        MODELS / "op_zoo.tflite",
        [INPUTS / "op_zoo.npy"],
        "esp32-devkitc",
        out_dir=tmp_path,
        variants=("optimized",),
        arena_kb=16,
        tflm_version="1.3.9",
        espnn_version="1.1.3",
        platform_version="6.12.0",
    )
    comp = yaml.safe_load((p.path / "main" / "idf_component.yml").read_text())
    assert comp["dependencies"]["espressif/esp-tflite-micro"]["version"] == "==1.3.9"
    assert comp["dependencies"]["espressif/esp-nn"]["version"] == "==1.1.3"
    assert "platform = espressif32 @ 6.12.0" in (p.path / "platformio.ini").read_text()
    manifest = json.loads(p.manifest_path.read_text())
    assert manifest["versions"]["esp-tflite-micro"] == "1.3.9"
    with pytest.raises(GenerateError, match="not a valid version"):
        gen.generate_projects(
            MODELS / "op_zoo.tflite",
            [INPUTS / "op_zoo.npy"],
            "sim",
            out_dir=tmp_path / "x",
            arena_kb=16,
            tflm_version='1.0"\n  evil/x: "1',
        )


def test_regenerate_keeps_mtimes_and_drops_stale_resolved_config(tmp_path: Path) -> None:
    args = (MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"])
    (p,) = gen.generate_projects(
        *args, "esp32s3-devkitc-1-n8r8", out_dir=tmp_path, variants=("optimized",), arena_kb=16
    )
    resolved = p.path / "sdkconfig.esp_check"
    resolved.write_text("CONFIG_NN_OPTIMIZED=y\n")
    app_mtime = (p.path / "main" / "app_main.cc").stat().st_mtime_ns
    gen.generate_projects(
        *args, "esp32s3-devkitc-1-n8r8", out_dir=tmp_path, variants=("optimized",), arena_kb=16
    )
    assert resolved.exists()  # nothing changed: keep PlatformIO's resolved config
    assert (p.path / "main" / "app_main.cc").stat().st_mtime_ns == app_mtime
    gen.generate_projects(
        *args, "esp32s3-devkitc-1-n8", out_dir=tmp_path, variants=("optimized",), arena_kb=16
    )
    assert not resolved.exists()  # sdkconfig.defaults changed: the stale resolved config must go
    assert "CONFIG_SPIRAM" not in (p.path / "sdkconfig.defaults").read_text()


def test_p4_project_has_no_platformio_ini_and_stale_file_removed(tmp_path: Path) -> None:
    args = (MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"])
    gen.generate_projects(*args, "esp32s3-devkitc-1-n8", out_dir=tmp_path, variants=("ansi",), arena_kb=16)
    assert (tmp_path / "ansi" / "platformio.ini").exists()
    (p,) = gen.generate_projects(*args, "esp32p4", out_dir=tmp_path, variants=("ansi",), arena_kb=16)
    assert not (p.path / "platformio.ini").exists()
    sdk = _sdkconfig_lines(p.path / "sdkconfig.defaults")
    assert sdk["CONFIG_ESP32P4_SELECTS_REV_LESS_V3"] == "y" and sdk["CONFIG_SPIRAM_MODE_HEX"] == "y"


def test_usage_errors(tmp_path: Path) -> None:
    m, i = MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"]
    with pytest.raises(GenerateError, match="unknown variant"):
        gen.generate_projects(m, i, "sim", out_dir=tmp_path, variants=("fast",), arena_kb=16)
    with pytest.raises(GenerateError, match="at least one --input"):
        gen.generate_projects(m, [], "sim", out_dir=tmp_path, arena_kb=16)
    with pytest.raises(GenerateError, match="tensor arena needs"):
        gen.generate_projects(m, i, "esp32-devkitc", out_dir=tmp_path, arena_kb=4096)
    assert not (tmp_path / "optimized").exists()  # nothing written before the checks pass


def test_arena_from_estimator(tmp_path: Path) -> None:
    (p,) = gen.generate_projects(
        MODELS / "op_zoo.tflite",
        [INPUTS / "op_zoo.npy"],
        "esp32-devkitc",
        out_dir=tmp_path,
        variants=("ansi",),
    )
    manifest = json.loads(p.manifest_path.read_text())
    assert manifest["arena_source"].startswith("estimate")
    # the arena is at least what the host TFLM needed for this model (README: 12,640 B) and KB-rounded
    assert p.arena_bytes >= 12640 and p.arena_bytes % 1024 == 0
    assert manifest["arena_estimate_bytes"] <= p.arena_bytes


def test_arena_reserves_the_pinned_espnn_scratch(tmp_path: Path) -> None:
    """A padded 3x3 first conv on 96x96x3: esp-nn 1.1.2 (pinned) asks for 31212 B of scratch on the S3;
    later esp-nn formulas say 704 B. The arena must hold the host's need plus the pinned version's."""
    pytest.importorskip("tflite_micro")
    from test_model_builder import padded_conv_model

    model = tmp_path / "padded_conv.tflite"
    model.write_bytes(padded_conv_model())
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 96, 96, 3), dtype=np.int8))
    board = "esp32s3-devkitc-1-n8"
    (p,) = gen.generate_projects(model, [npy], board, out_dir=tmp_path / "o", variants=("optimized",))
    manifest = json.loads(p.manifest_path.read_text())
    from harness.model.arena import estimate_arena

    host = estimate_arena(model, chip="esp32s3").host_bytes
    assert p.arena_bytes >= host + 31212
    assert manifest["versions"]["esp-nn"] == "1.1.2"
    assert manifest["arena_espnn_formulas"].startswith("esp-nn 1.1.2: scratch formulas of set 1.1 ")
    # pinning a later esp-nn changes the formula (and the arena) with it
    (q,) = gen.generate_projects(
        model, [npy], "esp32s3-devkitc-1-n8", out_dir=tmp_path / "q", variants=("optimized",),
        espnn_version="1.2.3",
    )  # fmt: skip
    assert host + 704 <= q.arena_bytes < p.arena_bytes


def test_cli_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "generate", str(MODELS / "cnn_classifier_11.tflite"),
            "--input", str(INPUTS / "cnn_classifier_11.png"),
            "--input", str(INPUTS / "cnn_classifier_11__ambiguous.png"),
            "--board", "esp32s3-devkitc-1-n8r2", "--out", str(tmp_path), "--arena-kb", "64", "--json",
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["variant"] for p in data["projects"]] == ["optimized", "ansi"]
    assert (tmp_path / "ansi" / "esp-check" / "input_1.bin").exists()
    rc = main(
        ["generate", str(MODELS / "unet_mbv2_035_128.tflite"),
         "--input", str(INPUTS / "unet_mbv2_035_128.png"),
         "--board", "esp32-devkitc", "--out", str(tmp_path / "big"), "--arena-kb", "1300"]
    )  # fmt: skip
    assert rc == ExitCode.USAGE
    assert "tensor arena" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--tflm-version", "--esp-nn-version", "--platform-version"])
def test_cli_generate_refuses_a_version_ending_in_a_newline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    """A version is written into idf_component.yml, platformio.ini and esp-check.json as given: with
    ``^...$`` and ``.match`` (``$`` matches before a final newline) "1.1.3\\n" passed and a project was
    written with a version that is not the one any registry has."""
    model, npy = str(MODELS / "op_zoo.tflite"), str(INPUTS / "op_zoo.npy")
    args = ["generate", model, "--input", npy, "--board", "esp32-devkitc", "--arena-kb", "16"]
    assert main([*args, "--out", str(tmp_path), option, "1.1.3\n"]) == ExitCode.USAGE
    assert "is not a valid version string" in capsys.readouterr().err
    assert not (tmp_path / "optimized").exists()


def test_board_sdkconfig_outside_allowlist_is_refused(tmp_path: Path) -> None:
    text = (Path(load_board("esp32-devkitc").source or "")).read_text()
    typo = tmp_path / "typo-board.toml"
    typo.write_text(
        text.replace('name = "esp32-devkitc"', 'name = "typo-board"')
        + '\n[sdkconfig]\nCONFIG_NN_ANSIC = "y"\n'
    )
    with pytest.raises(GenerateError, match="CONFIG_NN_ANSIC is not in the sdkconfig allow-list"):
        gen.generate_projects(
            MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], typo, out_dir=tmp_path, arena_kb=16
        )
    skip = tmp_path / "skip-board.toml"
    skip.write_text(
        text.replace('name = "esp32-devkitc"', 'name = "skip-board"')
        + '\n[sdkconfig]\nCONFIG_NN_SKIP_NUDGE = "y"\n'
    )
    with pytest.raises(GenerateError, match="must never be set"):
        gen.generate_projects(
            MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], skip, out_dir=tmp_path, arena_kb=16
        )
    wrong_chip = tmp_path / "c3-board.toml"
    c3 = (Path(load_board("esp32c3-devkitm-1").source or "")).read_text()
    wrong_chip.write_text(
        c3.replace('name = "esp32c3-devkitm-1"', 'name = "c3-board"')
        + '\n[sdkconfig]\nCONFIG_ESP_TASK_WDT_CHECK_IDLE_TASK_CPU1 = "y"\n'
    )
    with pytest.raises(GenerateError, match="does not exist for esp32c3"):
        gen.generate_projects(
            MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], wrong_chip, out_dir=tmp_path, arena_kb=16
        )
    assert not (tmp_path / "optimized").exists()


def test_symbol_newer_than_the_boards_oldest_idf_is_refused(tmp_path: Path) -> None:
    """An older ESP-IDF ignores a symbol it does not know: a v3 P4 board without idf_min would build a
    firmware for silicon before v3 on ESP-IDF 5.3 ... 5.5.1."""
    text = Path(load_board("esp32p4-v3").source or "").read_text()
    assert 'idf_min = "5.5.2"\n' in text
    loose = tmp_path / "p4-loose.toml"
    text = text.replace('name = "esp32p4-v3"', 'name = "p4-loose"')
    loose.write_text(text.replace('idf_min = "5.5.2"\n', ""))
    expected = r"exists only from ESP-IDF 5\.5\.2.*allows ESP-IDF 5\.3\.0"
    with pytest.raises(GenerateError, match=expected) as ei:
        gen.generate_projects(
            MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], loose, out_dir=tmp_path / "o", arena_kb=16
        )
    assert ei.value.exit_code == ExitCode.USAGE and 'idf_min = "5.5.2"' in (ei.value.hint or "")
    # the board for silicon before v3 may write CONFIG_ESP32P4_SELECTS_REV_LESS_V3=y on ESP-IDF 5.3: the
    # releases without the option build for exactly that silicon (allow-list: absent_means = "y")
    (p,) = gen.generate_projects(
        MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], "esp32p4", out_dir=tmp_path / "p",
        variants=("ansi",), arena_kb=16,
    )  # fmt: skip
    assert "CONFIG_ESP32P4_SELECTS_REV_LESS_V3=y" in (p.path / "sdkconfig.defaults").read_text()
    # and check_sdkconfig itself: "is not set" reads as n, which older releases do not behave as
    allow = gen.load_allowlist()
    line = "# CONFIG_ESP32P4_SELECTS_REV_LESS_V3 is not set\n"
    assert gen.check_sdkconfig(line, "esp32p4", allow, "x", idf_min="5.5.2") == [
        "CONFIG_ESP32P4_SELECTS_REV_LESS_V3"
    ]
    with pytest.raises(GenerateError, match="exists only from"):
        gen.check_sdkconfig(line, "esp32p4", allow, "x", idf_min="5.5.1")


def test_allowlist_entries_are_documented() -> None:
    assert ALLOW["idf_version"] == gen.DEFAULT_VERSIONS["idf"]
    low, below = resources.idf_support()
    for key, entry in ALLOW["symbols"].items():
        assert re.fullmatch(r"CONFIG_[A-Z0-9_]+", key)
        assert entry["checked_against"] and entry["kconfig"], key
        if "idf_since" in entry:  # only meaningful inside the supported range
            since = resources.version_tuple(entry["idf_since"])
            assert resources.version_tuple(low) < since < resources.version_tuple(below), key
    assert "CONFIG_NN_SKIP_NUDGE" in ALLOW["forbidden"]


def test_arena_far_below_measured_need_is_refused(tmp_path: Path) -> None:
    """TFLM segfaulted (not ERROR alloc) with 4 KB for op_zoo in a host build of the firmware."""
    pytest.importorskip("tflite_micro")
    model = Path(__file__).parent / "data" / "models" / "op_zoo.tflite"
    inp = Path(__file__).parent / "data" / "models" / "inputs" / "op_zoo.npy"
    with pytest.raises(GenerateError, match="less than half"):
        gen.generate_projects(
            model, [inp], "esp32-devkitc", out_dir=tmp_path / "a", variants=("ansi",), arena_kb=4
        )
    # a too-small-but-sane arena is the user's call: the firmware reports ERROR stage=alloc
    (p,) = gen.generate_projects(
        model, [inp], "esp32-devkitc", out_dir=tmp_path / "b", variants=("ansi",), arena_kb=8
    )
    assert p.arena_bytes == 8 * 1024


class _PioEnv:
    """A stand-in for PlatformIO's SCons environment as platform-espressif32 6.13.0 leaves it for
    `pio run -t upload` (builder/main.py, frameworks/espidf.py): the app at the default boot partition
    (ota_0, ESP32_APP_OFFSET), an erased ota_data_initial.bin at otadata in FLASH_EXTRA_IMAGES and, as
    offset/file pairs, in UPLOADERFLAGS; the command is `$UPLOADERFLAGS $ESP32_APP_OFFSET $SOURCE`."""

    def __init__(self, project: Path, images: list[tuple[str, str]], app_offset: str) -> None:
        self.vars: dict[str, object] = {
            "PROJECT_DIR": str(project),
            "PIOENV": "esp_check",
            "ESP32_APP_OFFSET": app_offset,
            "FLASH_EXTRA_IMAGES": images,
            "UPLOADERFLAGS": ["write_flash", "-z", *(x for pair in images for x in pair)],
        }

    def subst(self, text: str) -> str:
        return re.sub(r"\$(\w+)", lambda m: str(self.vars[m.group(1)]), text)

    def get(self, key: str, default: object = None) -> object:
        return self.vars.get(key, default)

    def Replace(self, **kw: object) -> None:
        self.vars.update(kw)

    def Append(self, **kw: list[object]) -> None:
        for k, v in kw.items():
            self.vars.setdefault(k, [])
            self.vars[k] = [*self.vars[k], *v]  # type: ignore[misc]

    def upload_pairs(self) -> dict[int, str]:
        flags = self.vars["UPLOADERFLAGS"] + [self.vars["ESP32_APP_OFFSET"], "firmware.bin"]  # type: ignore[operator]
        pairs = flags[flags.index("-z") + 1 :]
        return {int(pairs[k], 16): pairs[k + 1] for k in range(0, len(pairs), 2)}


@pytest.mark.parametrize("variant", ["optimized", "ansi"])
@pytest.mark.parametrize("resolved", [False, True])
def test_pio_upload_of_each_project_boots_its_own_variant(
    variant: str, resolved: bool, tmp_path: Path
) -> None:
    """`pio run -t upload` in each project, with the generated extra scripts run the way PlatformIO runs
    them (pre: before the platform's scripts, post: after): the app goes to its own slot, and the otadata
    uploaded with it boots that slot. On the old project the ANSI C app went to ota_0 with an erased
    otadata. ``resolved``: the variant read from PlatformIO's sdkconfig.esp_check after a build."""
    from harness.flashfmt.otadata import selected_slot
    from harness.flashfmt.partitions import VARIANT_SLOTS

    (p,) = gen.generate_projects(
        MODELS / "cnn_classifier_11.tflite", [], "esp32s3-devkitc-1-n8r8", out_dir=tmp_path,
        variants=(variant,), features=gen.FirmwareFeatures(embed_inputs=False),
    )  # fmt: skip
    if resolved:  # a resolved configuration wins over the defaults: same variant line, other layout
        text = (p.path / "sdkconfig.defaults").read_text()
        (p.path / "sdkconfig.esp_check").write_text("# resolved\n" + text)
        (p.path / "sdkconfig.defaults").write_text("")
    rows = {r["name"]: r["offset"] for r in p.manifest["flash_layout"]["partitions"]}
    blank = tmp_path / "ota_data_initial.bin"
    blank.write_bytes(b"\xff" * 0x2000)
    env = _PioEnv(p.path, [("0x0", "bootloader.bin"), ("0xc000", "partitions.bin"),
                           (hex(rows["otadata"]), str(blank))], hex(rows["ota_0"]))  # fmt: skip
    for script in ("pio_flash_model.py", "pio_boot_slot.py"):
        code = (p.path / "esp-check" / script).read_text()
        exec(compile(code, script, "exec"), {"Import": lambda _name: None, "env": env})
    pairs = env.upload_pairs()
    own = VARIANT_SLOTS[variant]
    assert [off for off, f in pairs.items() if f == "firmware.bin"] == [rows[f"ota_{own}"]]
    otadata = Path(env.subst(pairs[rows["otadata"]]))
    assert (selected_slot(otadata.read_bytes(), 2) or 0) == own
    extra = dict(env.vars["FLASH_EXTRA_IMAGES"])  # type: ignore[call-overload]
    assert Path(env.subst(extra[hex(rows["otadata"])])) == otadata


@pytest.mark.parametrize("baud", [921600, 115200])
def test_console_baud_other_than_115200_uses_the_custom_console(baud: int, tmp_path: Path) -> None:
    """A board whose console talks at 921600: ESP-IDF takes CONFIG_ESP_CONSOLE_UART_BAUDRATE only with
    CONFIG_ESP_CONSOLE_UART_CUSTOM=y (its Kconfig prompt depends on it; kconfgen drops the value under the
    default console, as kconfgen over ESP-IDF v5.3.5 / v5.4.4 / v5.5.3 confirmed: docs/firmware.md). The old
    template wrote the baud under CONFIG_ESP_CONSOLE_UART_DEFAULT=y: firmware that talked at 115200."""
    text = (resources.boards_dir() / "esp32s3-devkitc-1-n8.toml").read_text()
    board = tmp_path / "fast-console.toml"
    board.write_text(re.sub(r"(?m)^monitor_baud = \d+$", f"monitor_baud = {baud}", text).replace(
        'name = "esp32s3-devkitc-1-n8"', 'name = "fast-console"'))  # fmt: skip
    (p,) = gen.generate_projects(
        MODELS / "cnn_classifier_11.tflite", [], str(board), out_dir=tmp_path / "fw", variants=("ansi",),
        features=gen.FirmwareFeatures(embed_inputs=False),
    )  # fmt: skip
    text = (p.path / "sdkconfig.defaults").read_text()
    sdk = dict(ln.split("=", 1) for ln in text.splitlines() if ln.startswith("CONFIG_"))
    if baud == 115200:
        assert (
            sdk.get("CONFIG_ESP_CONSOLE_UART_DEFAULT") == "y"
            and "CONFIG_ESP_CONSOLE_UART_BAUDRATE" not in sdk
        )
    else:
        assert (
            sdk["CONFIG_ESP_CONSOLE_UART_CUSTOM"] == "y"
            and sdk["CONFIG_ESP_CONSOLE_UART_CUSTOM_NUM_0"] == "y"
        )
        assert sdk["CONFIG_ESP_CONSOLE_UART_BAUDRATE"] == str(baud)
        assert "CONFIG_ESP_CONSOLE_UART_DEFAULT" not in sdk


@pytest.mark.parametrize("memtest", [None, True, False])
def test_psram_memory_test_is_off_unless_the_board_asks(memtest: bool | None, tmp_path: Path) -> None:
    """ESP-IDF runs its PSRAM memory test at every boot by default (CONFIG_SPIRAM_MEMTEST, default y); the
    generated firmware turns it off unless the board file says ``psram_memtest = true``."""
    from harness.errors import EspCheckError

    text = (resources.boards_dir() / "esp32s3-devkitc-1-n8r8.toml").read_text()
    text = text.replace('name = "esp32s3-devkitc-1-n8r8"', 'name = "memtest"')
    board = tmp_path / "memtest.toml"
    board.write_text(text + ("" if memtest is None else f"psram_memtest = {str(memtest).lower()}\n"))
    (p,) = gen.generate_projects(
        MODELS / "cnn_classifier_11.tflite", [], str(board), out_dir=tmp_path / "fw", variants=("ansi",),
        features=gen.FirmwareFeatures(embed_inputs=False),
    )  # fmt: skip
    sdk = _sdkconfig_lines(p.path / "sdkconfig.defaults")
    assert sdk["CONFIG_SPIRAM"] == "y" and sdk["CONFIG_SPIRAM_MEMTEST"] == ("y" if memtest else None)
    no_psram = (resources.boards_dir() / "esp32s3-devkitc-1-n8.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(no_psram.replace('name = "esp32s3-devkitc-1-n8"', 'name = "bad"') + "psram_memtest = true")
    with pytest.raises(EspCheckError, match=r"psram_memtest.*no PSRAM"):
        load_board(str(bad))


def test_allowlist_requires_the_custom_console_for_the_baud() -> None:
    """The rule kconfgen confirmed, recorded in the allow-list (`requires`): a console baud under the
    default console, or a baud outside the Kconfig range, is refused before anything is built."""
    allow = gen.load_allowlist()
    base = 'CONFIG_IDF_TARGET="esp32"\n'
    with pytest.raises(GenerateError, match="takes effect only with CONFIG_ESP_CONSOLE_UART_CUSTOM=y"):
        text = base + "CONFIG_ESP_CONSOLE_UART_DEFAULT=y\nCONFIG_ESP_CONSOLE_UART_BAUDRATE=921600\n"
        gen.check_sdkconfig(text, "esp32", allow, "t")
    custom = base + "CONFIG_ESP_CONSOLE_UART_CUSTOM=y\nCONFIG_ESP_CONSOLE_UART_CUSTOM_NUM_0=y\n"
    assert "CONFIG_ESP_CONSOLE_UART_BAUDRATE" in gen.check_sdkconfig(
        custom + "CONFIG_ESP_CONSOLE_UART_BAUDRATE=921600\n", "esp32", allow, "t"
    )
    with pytest.raises(GenerateError, match=r"outside ESP-IDF's range 1200\.\.4000000"):
        gen.check_sdkconfig(custom + "CONFIG_ESP_CONSOLE_UART_BAUDRATE=5000000\n", "esp32", allow, "t")


def _function_body(source: str, signature: str) -> str:
    start = source.index("{", source.index(signature))
    depth = 0
    for pos in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[pos], 0)
        if depth == 0:
            return source[start : pos + 1]
    raise AssertionError(f"unbalanced braces after {signature}")


@pytest.mark.parametrize("tap", [False, True])
def test_no_tick_is_slept_per_invoke(tap: bool, tmp_path: Path) -> None:
    """The generated Invoke callback sleeps no FreeRTOS tick per invoke (10 ms on a chip at ESP-IDF's
    default 100 Hz: 10 s per 1,000 dataset inputs, with the old unconditional vTaskDelay(1)): its only
    vTaskDelay is behind the once-a-second idle check. Checked in the source, not by timing a run."""
    (p,) = gen.generate_projects(
        MODELS / "cnn_classifier_11.tflite", [], "esp32s3-devkitc-1-n8r8", out_dir=tmp_path,
        variants=("ansi",), features=gen.FirmwareFeatures(embed_inputs=False, tap=tap),
    )  # fmt: skip
    source = (p.path / "main" / "app_main.cc").read_text()
    body = _function_body(
        source, "int Invoke(void* ctx, const uint8_t* input, size_t n, uint32_t* invoke_us)"
    )
    guard = "if (end_us - g_app.idle_tick_us >= kIdleTickEveryUs) {"
    assert body.count("vTaskDelay(") == 1 and body.count(guard) == 1
    assert _function_body(body, guard).count("vTaskDelay(1)") == 1
    every = re.search(r"constexpr int64_t kIdleTickEveryUs = (\d+);", source)
    assert every is not None and int(every.group(1)) >= 1_000_000  # at most 1 % of the time at 10 ms/tick


def test_models_with_the_same_ops_give_the_same_app_sources(tmp_path: Path) -> None:
    """U-Net 48 and 64 (same ops, other arena and input size): with no inputs compiled in, every file the
    app is built from is byte-identical, and the build is reproducible (no date, mapped paths), so the
    second model rebuilds to the same apps and only its model partition (arena in the header) differs."""
    trees = {}
    for m in ("48", "64"):
        (p,) = gen.generate_projects(
            MODELS / f"unet_mbv2_035_{m}.tflite", [], "esp32s3-devkitc-1-n8r8", out_dir=tmp_path / m,
            variants=("ansi",), features=gen.FirmwareFeatures(embed_inputs=False),
        )  # fmt: skip
        trees[m] = {
            f.relative_to(p.path).as_posix(): f.read_bytes() for f in p.path.rglob("*") if f.is_file()
        }
    differ = sorted(k for k in trees["48"] if trees["48"][k] != trees["64"].get(k))
    assert differ == ["esp-check.json", "esp-check/model.tflite", "esp-check/partitions/model.bin"]
    sdk = _sdkconfig_lines(tmp_path / "48" / "ansi" / "sdkconfig.defaults")
    assert sdk["CONFIG_APP_REPRODUCIBLE_BUILD"] == "y"
    arenas = [parse_model_image(trees[m]["esp-check/partitions/model.bin"]).arena_bytes for m in ("48", "64")]
    assert arenas[0] < arenas[1]


def test_a_board_object_with_an_unknown_chip_is_refused_when_made() -> None:
    """harness.api exports Board, a plain dataclass: an API caller can make one naming a chip no board file
    may name (board-file validation never sees it). It is refused when made, naming the chips there are,
    so no later layer meets a chip without a CHIPS row: before, generation failed late (an unknown chip in
    the arena estimate), the flash layout fell back to a 4 MB data window, Board.cores was a KeyError,
    and flash-and-compare blamed the sim:// URL it had made itself."""
    from harness import api
    from harness.errors import BoardDefinitionError

    board = load_board("esp32s3-devkitc-1-n8r8")
    known = "esp32, esp32s2, esp32s3, esp32c3, esp32c6, esp32p4"
    with pytest.raises(
        BoardDefinitionError, match=f"board 'esp32s3-devkitc-1-n8r8': unknown chip 'esp99'.*{known}"
    ):
        replace(board, chip="esp99")
    with pytest.raises(BoardDefinitionError, match="unknown chip 'esp32x'"):
        api.Board(**{**vars(board), "chip": "esp32x"})
    assert replace(board, chip="esp32").cores == 2  # a known chip is still a Board
