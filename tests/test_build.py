"""`esp-check build`: the builder subprocess contract, artifacts/offsets, flasher_args.json, cache, failures.

FAKED HERE: the build tools. Real `pio run` / `idf.py build` need the internet to download ESP-IDF and the
toolchains, so each test puts a stand-in executable named `pio` (and `idf.py`) first on PATH. It is a small
Python script generated below that records its argv and environment and writes artifacts in the places
PlatformIO / ESP-IDF write them (a real ESP-IDF binary partition table built from the project's
partitions.csv, a resolved sdkconfig, dependencies.lock). Everything else -- esp-check's driver, cache,
locks, offsets, flasher_args.json and the sim builder's real ESP app image -- is real.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import BuildError, ExitCode, UsageError
from harness.firmware import build as b
from harness.firmware.cache import BuildCache
from harness.firmware.generate import generate_projects
from harness.flashfmt.partitions import pack_partition_table, table_rows

MODELS = Path(__file__).parent / "data" / "models"
INPUTS = MODELS / "inputs"

# Real PlatformIO 6.2 output when it cannot download the platform (captured on this offline machine on
# 2026-11-29 from `pio run` on a generated project; banner shortened).
PIO_OFFLINE_TRANSCRIPT = """\
Processing esp_check (platform: espressif32 @ 6.13.0; framework: espidf; board: esp32-c3-devkitm-1)
--------------------------------------------------------------------------------
Platform Manager: Installing espressif32 @ 6.13.0
HTTPClientError: """

FAKE_TOOL = r'''
"""FAKE build tool for esp-check tests (stands in for PlatformIO `pio` and ESP-IDF `idf.py`): it records its
arguments and writes artifacts where the real tools put them. It compiles nothing."""
import csv, hashlib, json, os, pathlib, struct, sys, time

tool = pathlib.Path(sys.argv[0]).name
args = sys.argv[1:]
with open(os.environ["FAKE_TOOL_RECORD"], "a", encoding="utf-8") as f:
    f.write(json.dumps({"tool": tool, "argv": args, "core_dir": os.environ.get("PLATFORMIO_CORE_DIR"),
                        "cwd": os.getcwd()}) + "\n")
time.sleep(float(os.environ.get("FAKE_TOOL_SLEEP", "0")))
mode = os.environ.get("FAKE_TOOL_MODE", "ok")
print("fake " + tool + " starting", flush=True)
if mode == "offline":
    print(os.environ["FAKE_OFFLINE_TEXT"], flush=True)
    sys.exit(1)
if mode == "compile":
    print("Compiling .pio/build/esp_check/src/app_main.cc.o")
    print("main/app_main.cc:12:5: error: 'foo' was not declared in this scope")
    print("*** [.pio/build/esp_check/src/app_main.cc.o] Error 1")
    print("========================= [FAILED] Took 3.21 seconds =========================")
    sys.exit(1)

if tool == "pio":
    assert args[:2] == ["run", "-d"] and args[3] == "-e", args
    proj = pathlib.Path(args[2]); env = args[4]
    out = proj / ".pio" / "build" / env
    files = {"bootloader": out / "bootloader.bin", "pt": out / "partitions.bin", "app": out / "firmware.bin",
             "otadata": out / "ota_data_initial.bin"}
    resolved = proj / ("sdkconfig." + env)
else:  # idf.py -C proj -B build -DIDF_TARGET=chip build
    proj = pathlib.Path(args[args.index("-C") + 1]); out = pathlib.Path(args[args.index("-B") + 1])
    assert args[-1] == "build" and any(a.startswith("-DIDF_TARGET=") for a in args), args
    files = {"bootloader": out / "bootloader" / "bootloader.bin",
             "pt": out / "partition_table" / "partition-table.bin",
             "app": out / "esp_check_fw.bin", "otadata": out / "ota_data_initial.bin"}
    resolved = proj / "sdkconfig"

defaults = (proj / "sdkconfig.defaults").read_text()
target = [l.split("=")[1].strip('"') for l in defaults.splitlines() if l.startswith("CONFIG_IDF_TARGET=")][0]
boot = {"esp32": "0x1000", "esp32p4": "0x2000"}.get(target, "0x0")
# like kconfig: the value from sdkconfig.defaults, else ESP-IDF's default 0x8000
pt_default = [l.split("=")[1] for l in defaults.splitlines()
              if l.startswith("CONFIG_PARTITION_TABLE_OFFSET=")]
pt_off = os.environ.get("FAKE_PT_OFFSET", pt_default[0] if pt_default else "0x8000")
app_off = os.environ.get("FAKE_APP_OFFSET")
rows = [r for r in csv.reader(open(proj / "partitions.csv")) if r and not r[0].startswith("#")]
types = {"app": 0, "data": 1}
subtypes = {"factory": 0, "nvs": 2, "phy": 1, "ota": 0, "ota_0": 0x10, "ota_1": 0x11}
table = b""
factory_size = 0
ota_size = 0
for name, typ, sub, off, size, *_ in [[c.strip() for c in r] for r in rows]:
    off_i = int(off, 0); size_i = int(size, 0)
    if typ == "app" and not factory_size:  # the first app partition (factory, or ota_0)
        factory_size = size_i
        if app_off:
            off_i = int(app_off, 0)
    if typ == "data" and sub == "ota":
        ota_size = size_i
    table += b"\xaa\x50" + struct.pack("<BBII16sI", types[typ], subtypes.get(sub) if sub in subtypes
                                        else int(sub, 0), off_i, size_i, name.encode().ljust(16, b"\0"), 0)
table += b"\xeb\xeb" + b"\xff" * 14 + hashlib.md5(table).digest()
for p in files.values():
    p.parent.mkdir(parents=True, exist_ok=True)
files["pt"].write_bytes(table.ljust(0xC00, b"\xff"))
files["bootloader"].write_bytes(b"\xe9\x03\x02\x20" + b"B" * 1000)
if ota_size:  # gen_esp32part / PlatformIO: an empty otadata image when the table has otadata
    files["otadata"].write_bytes(b"\xff" * ota_size)
app_size = factory_size + 16 if mode == "too_big" else 5000
seed = hashlib.sha256(defaults.encode()).digest()
files["app"].write_bytes((b"\xe9\x05\x02\x20" + seed * (app_size // 32 + 1))[:app_size])
resolved.write_text("CONFIG_IDF_TARGET=\"%s\"\nCONFIG_BOOTLOADER_OFFSET_IN_FLASH=%s\n"
                    "CONFIG_PARTITION_TABLE_OFFSET=%s\nCONFIG_ESPTOOLPY_FLASHMODE=\"dio\"\n"
                    "CONFIG_ESPTOOLPY_FLASHFREQ=\"80m\"\nCONFIG_ESPTOOLPY_FLASHSIZE=\"4MB\"\n"
                    % (target, boot, pt_off))
if os.environ.get("FAKE_NO_PT_OFFSET"):  # an sdkconfig that does not say (e.g. trimmed by hand)
    resolved.write_text("\n".join(l for l in resolved.read_text().splitlines()
                                  if not l.startswith("CONFIG_PARTITION_TABLE_OFFSET")) + "\n")
(proj / "dependencies.lock").write_text(
    "dependencies:\n  espressif/esp-nn:\n    version: 1.1.2\n  espressif/esp-tflite-micro:\n"
    "    version: 1.3.8\n  idf:\n    version: 5.5.3\nmanifest_hash: abc\ntarget: %s\nversion: 2.0.0\n"
    % target)
(files["app"].parent / files["app"].name.replace(".bin", ".elf")).write_bytes(b"\x7fELF fake " + seed)
if os.environ.get("FAKE_TOOL_CONFGEN", "1") == "1":  # ESP-IDF's confgen writes config/sdkconfig.json
    (out / "config").mkdir(exist_ok=True)
    (out / "config" / "sdkconfig.json").write_text(json.dumps({"IDF_TARGET": target, "FAKE_CONFGEN": True}))
if tool != "pio":
    idf_args = {"app": {"offset": "0x10000", "file": "esp_check_fw.bin"}}
    (out / "flasher_args.json").write_text(json.dumps(idf_args))
print("Building " + str(files["app"]))
print("========================= [SUCCESS] Took 1.00 seconds =========================", flush=True)
'''


@pytest.fixture
def fake_tools(tmp_path: Path) -> dict[str, object]:
    """A bin dir with FAKE `pio` and `idf.py` first on PATH, and where their invocations are recorded."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    for name in ("pio", "idf.py"):
        script = bindir / name
        script.write_text(f"#!{sys.executable}\n" + FAKE_TOOL, encoding="utf-8")
        script.chmod(0o755)
    record = tmp_path / "tool-calls.jsonl"
    env = dict(os.environ)
    env["PATH"] = str(bindir) + os.pathsep + env.get("PATH", "")
    env["FAKE_TOOL_RECORD"] = str(record)
    env["FAKE_OFFLINE_TEXT"] = PIO_OFFLINE_TRANSCRIPT
    return {"env": env, "record": record, "bindir": bindir}


def _calls(fake: dict[str, object]) -> list[dict[str, object]]:
    record = fake["record"]
    assert isinstance(record, Path)
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def _env(fake: dict[str, object], **extra: str) -> dict[str, str]:
    env = dict(fake["env"])  # type: ignore[call-overload]
    env.update(extra)
    return env


def _project(
    tmp_path: Path, board: str = "esp32-devkitc", variants: tuple[str, ...] = ("optimized", "ansi")
) -> list[Path]:
    projects = generate_projects(
        MODELS / "op_zoo.tflite",
        [INPUTS / "op_zoo.npy"],
        board,
        out_dir=tmp_path / "proj",
        variants=variants,
        arena_kb=16,
    )
    return [p.path for p in projects]


def test_pio_contract_artifacts_and_flasher_args(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    opt, _ = _project(tmp_path)
    lines: list[str] = []
    core = tmp_path / "pio-core"
    res = b.build_project(
        opt,
        cache_dir=tmp_path / "cache",
        env=_env(fake_tools),
        platformio_core_dir=core,
        on_output=lines.append,
    )
    (call,) = _calls(fake_tools)
    assert call["tool"] == "pio"
    assert call["argv"] == ["run", "-d", str(opt.resolve()), "-e", "esp_check"]
    assert call["core_dir"] == str(core)
    assert any("[SUCCESS]" in ln for ln in lines)  # output streamed to the callback
    assert res.log_path is not None and "[SUCCESS]" in res.log_path.read_text()
    assert not res.cache_hit and res.builder == "pio" and res.chip == "esp32"
    # offsets: ESP32 bootloader at 0x1000 (from the resolved sdkconfig), the table at the board's 0xc000,
    # otadata, the optimized app in ota_0, the model partition (docs/firmware.md "Flash layout", 4 MB)
    assert [(a.offset, a.role) for a in res.artifacts] == [
        (0x1000, "bootloader"),
        (0xC000, "partition-table"),
        (0x10000, "otadata"),
        (0x20000, "app"),
        (0x220000, "model"),
    ]
    build_dir = res.flasher_args.parent
    for a in res.artifacts:
        assert a.path.is_file() and build_dir in a.path.parents
    # one .bin at the top level, the app (pytest-embedded-idf takes the first top-level .bin as the app)
    assert sorted(p.name for p in build_dir.glob("*.bin")) == ["esp_check_fw.bin"]
    fa = json.loads(res.flasher_args.read_text())
    assert fa["flash_files"] == {
        "0x1000": "bootloader/bootloader.bin",
        "0xc000": "partition_table/partition-table.bin",
        "0x10000": "ota_data/ota_data_initial.bin",
        "0x20000": "esp_check_fw.bin",
        "0x220000": "model/model.bin",
    }
    assert fa["app"] == {"offset": "0x20000", "file": "esp_check_fw.bin", "encrypted": "false"}
    image = (opt / "esp-check" / "partitions" / "model.bin").read_bytes()
    assert (build_dir / "model" / "model.bin").read_bytes() == image
    assert fa["flash_settings"] == {"flash_mode": "dio", "flash_freq": "80m", "flash_size": "4MB"}
    assert fa["write_flash_args"] == ["--flash-mode", "dio", "--flash-freq", "80m", "--flash-size", "4MB"]
    assert fa["extra_esptool_args"]["chip"] == "esp32"
    assert res.flash_files()[0] == (0x1000, build_dir / "bootloader" / "bootloader.bin")
    assert [off for off, _ in res.flash_files(b.RUN_ROLES)] == [0x1000, 0xC000, 0x20000, 0x220000]
    import hashlib

    assert res.firmware_sha256 == hashlib.sha256(res.app_bin.read_bytes()).hexdigest()
    # the resolved component versions are recorded in the manifest after the build
    manifest = json.loads((opt / "esp-check.json").read_text())
    assert manifest["resolved"]["components"]["espressif/esp-nn"] == "1.1.2"


def test_offsets_come_from_resolved_config_not_constants(
    tmp_path: Path, fake_tools: dict[str, object]
) -> None:
    (opt,) = _project(tmp_path, board="esp32s3-devkitc-1-n8r8", variants=("optimized",))
    env = _env(fake_tools, FAKE_PT_OFFSET="0x9000", FAKE_APP_OFFSET="0x30000")
    res = b.build_project(opt, use_cache=False, env=env)
    assert [(a.offset, a.role) for a in res.artifacts] == [
        (0x0, "bootloader"),
        (0x9000, "partition-table"),  # what the resolved sdkconfig says wins
        (0x10000, "otadata"),
        (0x30000, "app"),
        (0x220000, "model"),
    ]
    # a resolved sdkconfig that does not say: the board's offset from the manifest, never a constant
    res = b.build_project(opt, use_cache=False, env=_env(fake_tools, FAKE_NO_PT_OFFSET="1"))
    assert [(a.offset, a.role) for a in res.artifacts][1] == (0xC000, "partition-table")
    manifest = json.loads((opt / "esp-check.json").read_text())
    manifest["board_def"]["partition_table_offset"] = 0xA000
    (opt / "esp-check.json").write_text(json.dumps(manifest))
    res = b.build_project(opt, use_cache=False, env=_env(fake_tools, FAKE_NO_PT_OFFSET="1"))
    assert [(a.offset, a.role) for a in res.artifacts][1] == (0xA000, "partition-table")
    del manifest["board_def"]["partition_table_offset"]
    (opt / "esp-check.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="says where the partition table goes"):
        b.build_project(opt, use_cache=False, env=_env(fake_tools, FAKE_NO_PT_OFFSET="1"))


def test_cache_hit_does_not_call_the_builder(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    opt, ansi = _project(tmp_path)
    cache = tmp_path / "cache"
    first = b.build_project(opt, cache_dir=cache, env=_env(fake_tools))
    # wipe the build outputs: a hit must restore them from the cache
    for p in (opt / ".pio", opt / "esp-check" / "build"):
        import shutil

        shutil.rmtree(p)
    second = b.build_project(opt, cache_dir=cache, env=_env(fake_tools))
    assert len(_calls(fake_tools)) == 1
    assert second.cache_hit and second.cache_key == first.cache_key
    assert second.firmware_sha256 == first.firmware_sha256 and second.app_bin.is_file()
    assert json.loads(second.flasher_args.read_text()) == json.loads(first.flasher_args.read_text())
    assert "builder not run" in second.log_path.read_text()  # type: ignore[union-attr]
    # the other variant differs (sdkconfig.defaults): a miss, and a different firmware
    other = b.build_project(ansi, cache_dir=cache, env=_env(fake_tools))
    assert not other.cache_hit and other.cache_key != first.cache_key
    assert other.firmware_sha256 != first.firmware_sha256
    assert len(_calls(fake_tools)) == 2


def test_cache_key_tracks_inputs_not_products(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    manifest = json.loads((opt / "esp-check.json").read_text())
    key = b.cache_key(opt, "pio", manifest)
    # build products, resolved state and the manifest's "resolved" section do not change the key
    (opt / ".pio" / "build").mkdir(parents=True)
    (opt / ".pio" / "build" / "x.o").write_bytes(b"obj")
    (opt / "sdkconfig.esp_check").write_text("CONFIG_X=y\n")
    (opt / "dependencies.lock").write_text("x")
    (opt / "esp-check" / "build").mkdir(parents=True, exist_ok=True)
    (opt / "esp-check" / "build" / "build.log").write_text("log")
    assert b.cache_key(opt, "pio", manifest) == key
    # a user edit of a source file, another builder, other pinned versions: a different key
    assert b.cache_key(opt, "idf", manifest) != key
    other_versions = dict(manifest, versions=dict(manifest["versions"], **{"esp-nn": "1.1.3"}))
    assert b.cache_key(opt, "pio", other_versions) != key
    app = opt / "main" / "app_main.cc"
    app.write_text(app.read_text() + "\n// local edit\n")
    assert b.cache_key(opt, "pio", manifest) != key
    (opt / "main" / "extra.c").write_text("int x;\n")
    assert len({key, b.cache_key(opt, "pio", manifest)}) == 2


@pytest.mark.slow
def test_concurrent_builds_of_the_same_project_build_once(
    tmp_path: Path, fake_tools: dict[str, object]
) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    code = textwrap.dedent(
        f"""
        from harness.firmware.build import build_project
        r = build_project({str(opt)!r}, cache_dir={str(tmp_path / "cache")!r})
        print("HIT" if r.cache_hit else "MISS", r.firmware_sha256)
        """
    )
    env = _env(fake_tools, FAKE_TOOL_SLEEP="1.5")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = sorted(o[0].split()[0] for o in outs)
    assert results == ["HIT", "MISS"]
    assert len({o[0].split()[1] for o in outs}) == 1
    assert len(_calls(fake_tools)) == 1


def test_builder_missing(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(BuildError, match=r"PlatformIO .* not installed") as ei:
        b.build_project(opt, use_cache=False, env=_env(fake_tools, PATH=str(empty)))
    assert (
        ei.value.exit_code == ExitCode.INFRASTRUCTURE
        and ei.value.hint
        and "pip install platformio" in ei.value.hint
    )
    (p4,) = _project(tmp_path / "p4", board="esp32p4", variants=("optimized",))
    with pytest.raises(BuildError, match=r"idf\.py is not on PATH") as ei:
        b.build_project(p4, use_cache=False, env=_env(fake_tools, PATH=str(empty)))
    assert ei.value.hint and "export.sh" in ei.value.hint


def test_a_builder_given_by_a_relative_path_runs_from_the_project(
    tmp_path: Path, fake_tools: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--pio tools/pio` names a file relative to where esp-check was started; the builder runs in the
    project directory, where that relative path names nothing."""
    (opt,) = _project(tmp_path, variants=("optimized",))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.chdir(tmp_path)  # fakebin/pio is here, and not on PATH
    res = b.build_project(opt, use_cache=False, env=_env(fake_tools, PATH=str(empty)), pio="fakebin/pio")
    (call,) = _calls(fake_tools)
    assert call["tool"] == "pio" and res.builder == "pio" and res.app_bin.is_file()


def test_offline_download_failure_is_recognized(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    with pytest.raises(BuildError) as ei:
        b.build_project(opt, cache_dir=tmp_path / "cache", env=_env(fake_tools, FAKE_TOOL_MODE="offline"))
    msg = str(ei.value)
    assert "could not download" in msg and "offline" in msg
    assert "Installing espressif32 @ 6.13.0" in msg and "HTTPClientError" in msg  # the relevant lines
    assert str(opt.resolve() / "esp-check" / "build" / "build.log") in msg
    assert "PLATFORMIO_CORE_DIR" in (ei.value.hint or "")
    # a failed build is not cached: the next attempt runs the tool again
    with pytest.raises(BuildError):
        b.build_project(opt, cache_dir=tmp_path / "cache", env=_env(fake_tools, FAKE_TOOL_MODE="offline"))
    assert len(_calls(fake_tools)) == 2


def test_compile_error_shows_the_error_lines(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    with pytest.raises(BuildError) as ei:
        b.build_project(opt, use_cache=False, env=_env(fake_tools, FAKE_TOOL_MODE="compile"))
    msg = str(ei.value)
    assert "did not compile" in msg and "'foo' was not declared" in msg
    assert "fake pio starting" not in msg  # only the relevant lines, the rest is in the log
    log = opt / "esp-check" / "build" / "build.log"
    assert "fake pio starting" in log.read_text() and str(log.resolve()) in msg


def test_binary_larger_than_partition(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    with pytest.raises(BuildError, match="larger than its app partition 'ota_0'") as ei:
        b.build_project(opt, use_cache=False, env=_env(fake_tools, FAKE_TOOL_MODE="too_big"))
    assert "partitions.csv" in (ei.value.hint or "")


def test_app_goes_where_the_bootloader_boots_it_or_the_build_refuses(
    tmp_path: Path, fake_tools: dict[str, object]
) -> None:
    """A partitions.csv without ota_0: the optimized app has no partition ESP-IDF's bootloader boots it
    from. The sim and native builders refused it; pio/idf put the app in the first app partition (here
    ota_1, which a one-OTA-app table never boots) and reported a good build."""
    (opt,) = _project(tmp_path, variants=("optimized",))
    csv_path = opt / "partitions.csv"
    csv_path.write_text("".join(ln for ln in csv_path.read_text().splitlines(True) if "ota_0" not in ln))
    refused = r"built partition table \S+ has no app partition .* the optimized app from"
    with pytest.raises(BuildError, match=refused):
        b.build_project(opt, use_cache=False, env=_env(fake_tools))


def test_stale_resolved_sdkconfig_is_removed(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    stale = opt / "sdkconfig.esp_check"
    stale.write_text("CONFIG_NN_ANSI_C=y\n")
    old = (opt / "sdkconfig.defaults").stat().st_mtime - 100
    os.utime(stale, (old, old))
    b.build_project(opt, use_cache=False, env=_env(fake_tools))
    assert "CONFIG_NN_ANSI_C" not in stale.read_text()  # the fake wrote a fresh one after the old was deleted


def test_idf_builder_for_p4(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (p4,) = _project(tmp_path, board="esp32p4", variants=("ansi",))
    res = b.build_project(p4, cache_dir=tmp_path / "cache", env=_env(fake_tools))
    (call,) = _calls(fake_tools)
    assert call["tool"] == "idf.py"
    assert call["argv"] == [
        "-C",
        str(p4.resolve()),
        "-B",
        str(p4.resolve() / "build"),
        "-DIDF_TARGET=esp32p4",
        "build",
    ]
    assert [(a.offset, a.role) for a in res.artifacts] == [
        (0x2000, "bootloader"),
        (0xC000, "partition-table"),  # 40 KB for the P4 bootloader instead of 24 KB
        (0x10000, "otadata"),
        (0x120000, "app"),  # the ANSI C app goes to ota_1
        (0x220000, "model"),
    ]
    with pytest.raises(UsageError, match="cannot be built with PlatformIO"):
        b.build_project(p4, builder="pio", use_cache=False, env=_env(fake_tools))


def test_builder_must_suit_the_board(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    (opt,) = _project(tmp_path, variants=("optimized",))
    with pytest.raises(UsageError, match="cannot be built with builder 'sim'"):
        b.build_project(opt, builder="sim", use_cache=False, env=_env(fake_tools))
    (sim,) = _project(tmp_path / "s", board="sim", variants=("optimized",))
    with pytest.raises(UsageError, match="cannot be built with builder 'pio'"):
        b.build_project(sim, builder="pio", use_cache=False, env=_env(fake_tools))
    with pytest.raises(Exception, match="not an esp-check project"):
        b.build_project(tmp_path, use_cache=False)
    assert _calls(fake_tools) == []


def test_sim_builder_packs_a_real_esp_image_and_caches(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    from esptool.bin_image import LoadFirmwareImage

    opt, ansi = _project(tmp_path, board="sim")
    cache = tmp_path / "cache"
    r1 = b.build_project(opt, cache_dir=cache)
    r2 = b.build_project(ansi, cache_dir=cache)
    assert _calls(fake_tools) == []  # no external tool for the simulated board
    roles = ["bootloader", "partition-table", "otadata", "app", "model"]
    assert r1.builder == "sim" and [a.role for a in r1.artifacts] == roles
    assert [a.offset for a in r1.artifacts if a.role == "app"] == [0x20000]
    assert [a.offset for a in r2.artifacts if a.role == "app"] == [0x120000]
    image = LoadFirmwareImage("esp32s3", str(r1.app_bin))
    assert image.checksum is not None and len(image.segments) >= 1
    assert r1.firmware_sha256 != r2.firmware_sha256  # the variant is compiled into the image
    again = b.build_project(opt, cache_dir=cache)
    assert again.cache_hit and again.firmware_sha256 == r1.firmware_sha256
    fa = json.loads(again.flasher_args.read_text())
    assert fa["app"]["offset"] == "0x20000" and fa["extra_esptool_args"]["chip"] == "esp32s3"
    # real esptool reads the @flash_args file beside flasher_args.json: merge the images with it
    out = again.flasher_args.parent
    proc = subprocess.run(
        [sys.executable, "-m", "esptool", "--chip", "esp32s3", "merge-bin", "-o", "merged.bin",
         "@flash_args"],
        cwd=out, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    merged = (out / "merged.bin").read_bytes()
    assert merged[0x20000 : 0x20000 + again.app_bin.stat().st_size] == again.app_bin.read_bytes()
    assert merged[0xC000 : 0xC000 + 0xC00] == (out / "partition_table" / "partition-table.bin").read_bytes()
    model = (out / "model" / "model.bin").read_bytes()
    assert merged[0x220000 : 0x220000 + len(model)] == model


_REPEAT_IMPORTS = """
import sys
from pathlib import Path
from harness.firmware import build
import harness.device.session  # what a flash-and-compare run loads to reach the board
from harness.flows.resident import app_slot_sha256
res = build.build_project(Path(sys.argv[1]), cache_dir=Path(sys.argv[2]))
assert res.cache_hit
print(app_slot_sha256(res), sorted(m for m in sys.modules if m.split(".")[0] == "esptool"))
"""


def test_the_app_slot_sha256_is_stored_with_the_build_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SHA-256 the flash skip compares with HELLO is computed once per build (esptool's image
    parser), kept in the cache entry, and read back on a repeat run without importing esptool.
    Nothing faked: the simulator's builder; ``slot_sha256`` is wrapped only to count its calls."""
    from harness.protocol.app_image import slot_sha256

    opt, _ = _project(tmp_path, board="sim")
    cache = tmp_path / "cache"
    first = b.build_project(opt, cache_dir=cache)
    want = slot_sha256(first.app_bin.read_bytes(), "esp32s3")
    assert want and first.app_slot_sha256 == want
    calls: list[str] = []
    monkeypatch.setattr(b, "slot_sha256", lambda data, chip: calls.append(chip) or slot_sha256(data, chip))
    again = b.build_project(opt, cache_dir=cache)
    assert again.cache_hit and again.app_slot_sha256 == want and calls == []
    meta_path = cache / "entries" / again.cache_key / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["app_slot"]  # an entry written before the field: computed once, then stored
    meta_path.write_text(json.dumps(meta))
    assert b.build_project(opt, cache_dir=cache).app_slot_sha256 == want and len(calls) == 1
    assert b.build_project(opt, cache_dir=cache).app_slot_sha256 == want and len(calls) == 1
    meta = json.loads(meta_path.read_text())
    meta["app_slot"] = {"sha256": "0" * 64, "slot_sha256": "f" * 64}  # not these bytes: never trusted
    meta_path.write_text(json.dumps(meta))
    assert b.build_project(opt, cache_dir=cache).app_slot_sha256 == want and len(calls) == 2
    b.build_project(opt, cache_dir=cache)  # (repaired) ... and a fresh process loads no esptool
    root = str(Path(b.__file__).resolve().parents[2])
    got = subprocess.run(
        [sys.executable, "-c", _REPEAT_IMPORTS, str(opt), str(cache)],
        env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [want, "[]"]


def test_cache_is_size_bounded_lru_and_respects_locks(tmp_path: Path) -> None:
    src = tmp_path / "blob"
    src.write_bytes(b"x" * 1000)
    cache = BuildCache(tmp_path / "c", max_bytes=2600)
    keys = ["a" * 64, "b" * 64, "c" * 64, "d" * 64]
    cache.put(keys[0], {"app.bin": src}, {"offsets": {}})
    cache.put(keys[1], {"app.bin": src}, {"offsets": {}})
    # make key 0 the most recently used, key 1 the least
    os.utime(cache.entry_dir(keys[1]) / ".used", (1, 1))
    assert cache.get(keys[0]) is not None
    cache.put(keys[2], {"app.bin": src}, {"offsets": {}})
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None and cache.get(keys[2]) is not None
    assert sum(size for _, size, _ in cache.entries()) <= 2600
    # an entry whose lock is held (a build using it) is never evicted
    os.utime(cache.entry_dir(keys[0]) / ".used", (1, 1))
    with cache.lock(keys[0]):
        cache.put(keys[3], {"app.bin": src}, {"offsets": {}})
        assert cache.get(keys[0]) is not None
    assert cache.get(keys[2]) is None  # the next least recently used went instead
    # a truncated entry is a miss, not a corrupt hit
    (cache.entry_dir(keys[3]) / "app.bin").write_bytes(b"short")
    assert cache.get(keys[3]) is None


def test_cli_build_json_and_failure(
    tmp_path: Path,
    fake_tools: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    opt, ansi = _project(tmp_path)
    for k, v in _env(fake_tools).items():
        monkeypatch.setenv(k, v)
    rc = main(["build", str(opt), str(ansi), "--cache-dir", str(tmp_path / "cache"), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [x["cache_hit"] for x in data["builds"]] == [False, False]
    assert data["builds"][0]["artifacts"][0] == {
        "offset": 0x1000,
        "path": str(opt.resolve() / "esp-check" / "build" / "bootloader" / "bootloader.bin"),
        "role": "bootloader",
    }
    monkeypatch.setenv("FAKE_TOOL_MODE", "compile")
    rc = main(["build", str(opt), "--no-cache"])
    assert rc == ExitCode.INFRASTRUCTURE
    err = capsys.readouterr().err
    assert "did not compile" in err and "build.log" in err


def test_windows_path_limits_are_checked_before_building() -> None:
    # ESP-IDF as PlatformIO installs it fails under spaces, non-ASCII or long paths on Windows.
    b.check_build_paths(Path("C:/esp/fw/optimized"), Path("C:/pio"), platform="win32")
    with pytest.raises(BuildError, match="contains a space") as ei:
        b.check_build_paths(Path("C:/Users/Ann Lee/fw"), None, platform="win32")
    assert "--out" in (ei.value.hint or "")
    with pytest.raises(BuildError, match=r"PLATFORMIO_CORE_DIR .* non-ASCII") as ei:
        b.check_build_paths(Path("C:/esp/fw"), Path("C:/Users/Jürgen/.platformio"), platform="win32")
    assert "--platformio-core-dir" in (ei.value.hint or "")
    with pytest.raises(BuildError, match="characters long"):
        b.check_build_paths(Path("C:/" + "x" * 100), None, platform="win32")
    b.check_build_paths(Path("/home/Jürgen Ö/fw"), None, platform="linux")  # fine elsewhere


def test_spaces_and_non_ascii_in_project_path(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    out = tmp_path / "mön dir with spaces"
    projects = generate_projects(
        MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], "esp32-devkitc", out_dir=out, arena_kb=16,
        variants=("optimized",),
    )  # fmt: skip
    res = b.build_project(projects[0].path, use_cache=False, env=_env(fake_tools))
    (call,) = _calls(fake_tools)
    assert call["argv"][2] == str(projects[0].path.resolve())  # one argument, not split at spaces
    assert res.app_bin.is_file()
    manifest = json.loads(projects[0].manifest_path.read_text(encoding="utf-8"))
    assert all("\\" not in f and not f.startswith("/") for f in manifest["files"])  # relative POSIX paths


def test_partition_table_parser_reads_the_sim_packers_tables() -> None:
    sim_helpers = pytest.importorskip("sim_helpers")  # it needs harness.sim.image
    parts = sim_helpers.default_partitions(0x123456, 0xC000)
    parsed = table_rows(pack_partition_table(parts))
    assert [(p.label, p.type, p.subtype, p.offset, p.size) for p in parsed] == [
        (p.label, p.type, p.subtype, p.offset, p.size) for p in parts
    ]
    assert table_rows(b"\xff" * 0xC00) == []


def test_parse_resolved_sdkconfig() -> None:
    text = (
        '# comment\nCONFIG_IDF_TARGET="esp32s3"\n# CONFIG_X is not set\n'
        "CONFIG_PARTITION_TABLE_OFFSET=0xc000\n"
    )
    expected = {"CONFIG_IDF_TARGET": "esp32s3", "CONFIG_PARTITION_TABLE_OFFSET": "0xc000"}
    assert b.parse_sdkconfig(text) == expected


# ---- ESP-IDF build directory layout ----------------------------------------------------------------


def _top_level(build_dir: Path) -> dict[str, list[str]]:
    names = sorted(p.name for p in build_dir.iterdir() if p.is_file())
    return {ext: [n for n in names if n.endswith(ext)] for ext in (".bin", ".elf")}


def _check_idf_layout(res: b.BuildResult, chip: str) -> None:
    """What ESP-IDF leaves and what its tools read: the real pytest-embedded-idf IdfApp parses it."""
    from pytest_embedded_idf.app import IdfApp

    out = res.flasher_args.parent
    assert _top_level(out) == {".bin": ["esp_check_fw.bin"], ".elf": ["esp_check_fw.elf"]}
    assert (out / "bootloader" / "bootloader.bin").is_file()
    assert (out / "partition_table" / "partition-table.bin").is_file()
    fa = json.loads(res.flasher_args.read_text())
    assert all((out / f).is_file() for f in fa["flash_files"].values())
    assert res.app_bin == out / "esp_check_fw.bin" and res.elf == out / "esp_check_fw.elf"
    desc = json.loads((out / "project_description.json").read_text())
    assert (out / desc["app_bin"]).is_file() and (out / desc["app_elf"]).is_file() and desc["target"] == chip
    sdk = json.loads((out / "config" / "sdkconfig.json").read_text())
    assert sdk["IDF_TARGET"] == chip
    app = IdfApp(app_path=str(res.project_dir), build_dir=str(out))  # the real client's parser
    assert Path(app.bin_file) == res.app_bin.resolve() and Path(app.elf_file) == res.elf.resolve()
    assert app.target == chip
    assert [(f.offset, Path(f.file_path)) for f in app.flash_files] == [
        (a.offset, a.path.resolve()) for a in res.artifacts
    ]
    lines = (out / "flash_args").read_text().split("\n")
    assert lines[0].startswith("--flash-mode") and "bootloader/bootloader.bin" in lines[1]


def test_sim_build_directory_follows_esp_idf_layout(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    opt, ansi = _project(tmp_path, board="sim")
    stale = opt / "esp-check" / "build"
    stale.mkdir(parents=True, exist_ok=True)
    (stale / "bootloader.bin").write_bytes(b"old flat layout")  # an older esp-check's top-level image
    res = b.build_project(opt, cache_dir=tmp_path / "cache")
    _check_idf_layout(res, "esp32s3")
    sdk = json.loads((res.flasher_args.parent / "config" / "sdkconfig.json").read_text())
    assert sdk["NN_OPTIMIZED"] is True and "NN_ANSI_C" not in sdk and sdk["IDF_TARGET_ARCH_XTENSA"] is True
    assert sdk["ESPTOOLPY_FLASHSIZE"] == "8MB"
    other = b.build_project(ansi, cache_dir=tmp_path / "cache")
    other_sdk = json.loads((other.flasher_args.parent / "config" / "sdkconfig.json").read_text())
    assert other_sdk["NN_ANSI_C"] is True
    import shutil

    shutil.rmtree(res.flasher_args.parent)
    again = b.build_project(opt, cache_dir=tmp_path / "cache")  # a cache hit restores the whole layout
    assert again.cache_hit
    _check_idf_layout(again, "esp32s3")
    assert again.elf is not None and again.elf.read_bytes() == res.elf.read_bytes()  # type: ignore[union-attr]


@pytest.mark.parametrize("confgen_json", [True, False])
def test_platformio_build_is_exported_in_esp_idf_layout(
    tmp_path: Path, fake_tools: dict[str, object], confgen_json: bool
) -> None:
    """.pio/build/esp_check (firmware.bin, bootloader.bin, partitions.bin, firmware.elf, config/) exported
    as an ESP-IDF build directory; without PlatformIO's config/sdkconfig.json it is written from the
    resolved sdkconfig."""
    (opt,) = _project(tmp_path, board="esp32s3-devkitc-1-n8r8", variants=("optimized",))
    env = _env(fake_tools, FAKE_TOOL_CONFGEN="1" if confgen_json else "0")
    res = b.build_project(opt, use_cache=False, env=env)
    _check_idf_layout(res, "esp32s3")
    pio_out = opt / ".pio" / "build" / "esp_check"
    assert res.app_bin.read_bytes() == (pio_out / "firmware.bin").read_bytes()
    assert res.elf is not None and res.elf.read_bytes() == (pio_out / "firmware.elf").read_bytes()
    sdk = json.loads((res.flasher_args.parent / "config" / "sdkconfig.json").read_text())
    if confgen_json:
        assert sdk == json.loads((pio_out / "config" / "sdkconfig.json").read_text())
    else:  # from sdkconfig.esp_check: booleans, numbers and strings as ESP-IDF's confgen writes them
        table = next(a for a in res.artifacts if a.role == "partition-table")
        assert sdk["PARTITION_TABLE_OFFSET"] == table.offset and sdk["ESPTOOLPY_FLASHMODE"] == "dio"
        assert sdk["IDF_TARGET"] == "esp32s3"


def test_sdkconfig_json_types() -> None:
    text = ('CONFIG_IDF_TARGET="esp32c3"\nCONFIG_NN_OPTIMIZED=y\n# CONFIG_NN_ANSI_C is not set\n'
            "CONFIG_PARTITION_TABLE_OFFSET=0xc000\nCONFIG_ESP_MAIN_TASK_STACK_SIZE=20480\n")  # fmt: skip
    assert b.sdkconfig_json(text) == {
        "IDF_TARGET": "esp32c3",
        "NN_OPTIMIZED": True,
        "NN_ANSI_C": False,
        "PARTITION_TABLE_OFFSET": 0xC000,
        "ESP_MAIN_TASK_STACK_SIZE": 20480,
    }


@pytest.mark.parametrize(("board", "builder"), [("esp32-devkitc", "pio"), ("esp32p4", "idf"), ("sim", "sim")])
def test_each_build_directory_boots_its_own_variant(
    board: str, builder: str, tmp_path: Path, fake_tools: dict[str, object]
) -> None:
    """The exported build directory of each variant, flashed on its own (flash_args, flasher_args.json):
    the app sits in its slot and the otadata flashed with it selects that slot; a cache hit too. The
    builders' own ota_data_initial.bin is erased (it boots ota_0): on the old code the ANSI C build
    directory flashed the ANSI C app to ota_1 and booted whatever sat in ota_0."""
    from harness.flashfmt.otadata import selected_slot
    from harness.flashfmt.partitions import VARIANT_SLOTS

    for variant in ("optimized", "ansi"):
        (proj,) = _project(tmp_path / variant, board=board, variants=(variant,))
        for hit in (False, True):
            res = b.build_project(proj, cache_dir=tmp_path / "cache", env=_env(fake_tools))
            assert res.cache_hit is hit
            table = table_rows(res.artifact("partition-table").path.read_bytes())  # type: ignore[union-attr]
            slots = [p for p in table if p.type == 0x00 and 0x10 <= p.subtype < 0x20]
            own = VARIANT_SLOTS[variant]
            out = res.flasher_args.parent
            fa = json.loads(res.flasher_args.read_text())
            assert int(fa["app"]["offset"], 16) == slots[own].offset
            otadata = (out / fa["otadata"]["file"]).read_bytes()
            assert len(otadata) == 0x2000 and (selected_slot(otadata, len(slots)) or 0) == own
            pairs = [ln.split() for ln in (out / "flash_args").read_text().splitlines()[1:]]
            assert [int(o, 16) for o, f in pairs if f == "esp_check_fw.bin"] == [slots[own].offset]
            assert [(out / f).read_bytes() for o, f in pairs if int(o, 16) == 0x10000] == [otadata]


def test_build_directory_has_the_gdbinit_prefix_map(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    """`gdbinit/prefix_map`, where ESP-IDF's build writes it: ESP-IDF's own line for a build without a
    prefix map (sim), the builder's own file when it wrote one (pio, also from the cache). gdb, run the way
    pytest-embedded-idf's panic decoding runs it (`--command` the path IdfDut picks), then reads it without
    a warning; the old build directory had none ("No such file or directory")."""
    (sim,) = _project(tmp_path / "s", board="sim", variants=("optimized",))
    res = b.build_project(sim, cache_dir=tmp_path / "cache", env=_env(fake_tools))
    out = res.flasher_args.parent
    assert (
        out / "gdbinit" / "prefix_map"
    ).read_text() == "# There is no prefix map defined for the project.\n"
    gdb = shutil.which("gdb")
    if gdb is not None and importlib.util.find_spec("pytest_embedded_idf") is not None:
        from types import SimpleNamespace

        from pytest_embedded_idf.dut import IdfDut

        path = IdfDut._get_prefix_map_path(SimpleNamespace(app=SimpleNamespace(binary_path=str(out))))  # type: ignore[arg-type]
        proc = subprocess.run(
            [gdb, "--batch", "-n", "--command", path], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and "No such file" not in proc.stdout + proc.stderr, proc.stderr
    (opt,) = _project(tmp_path / "p", variants=("optimized",))
    own = opt / ".pio" / "build" / "esp_check" / "gdbinit" / "prefix_map"
    own.parent.mkdir(parents=True)
    own.write_text("set substitute-path /IDF_PROJECT /src/project\n")
    for hit in (False, True):
        res = b.build_project(opt, cache_dir=tmp_path / "cache", env=_env(fake_tools))
        assert res.cache_hit is hit
        assert (res.flasher_args.parent / "gdbinit" / "prefix_map").read_text() == own.read_text()


# ---- esp-check run on an offline bench: ports checked first, the platform download tried once ----------


def _offline_bench(tmp_path: Path, port: str) -> tuple[Path, Path]:
    """A plan of three models on one real board type (two jobs' worth of firmware), and its inventory."""
    import numpy as np

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    models = ("cnn_classifier_11", "op_zoo", "unet_mbv2_035_48")
    for m in models:
        np.save(inputs / f"{m}.npy", np.load(INPUTS / f"{m}.npy"))
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[job]]\nname = "offline"\n'
        f"models = {json.dumps([str(MODELS / f'{m}.tflite') for m in models])}\n"
        f'inputs = ["{inputs}/{{model}}.npy"]\nboards = ["esp32s3-devkitc-1-n8r8"]\n'
    )
    inv = tmp_path / "bench.toml"
    inv.write_text(f'[[board]]\nname = "s3"\ntype = "esp32s3-devkitc-1-n8r8"\nport = "{port}"\n')
    return plan, inv


def test_run_tries_an_unreachable_platform_once(
    tmp_path: Path, fake_tools: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKED: `pio` (the stand-in, offline: it prints PlatformIO's own HTTPClientError transcript) and the
    board's serial port (a pty that exists; nothing is flashed: no firmware gets built). The first build
    finds the platform unreachable; the run builds nothing more (each build retried the download for 2-3
    minutes: 14 minutes to exit 3) and every task says why."""
    master, slave = os.openpty()
    try:
        plan, inv = _offline_bench(tmp_path, os.ttyname(slave))
        for k, v in _env(fake_tools, FAKE_TOOL_MODE="offline").items():
            monkeypatch.setenv(k, v)
        out = tmp_path / "out"
        args = ["run", str(plan), "-i", str(inv), "--out", str(out), "--lock-dir", str(tmp_path / "locks"),
                "--cache-dir", str(tmp_path / "cache"), "--no-step-summary"]  # fmt: skip
        assert main(args) == ExitCode.INFRASTRUCTURE
    finally:
        os.close(master)
        os.close(slave)
    firmware_dirs = {Path(c["argv"][2]).parent.parent for c in _calls(fake_tools)}  # pio run -d PROJECT
    assert len(firmware_dirs) == 1, _calls(fake_tools)  # one firmware (its two variants) tried, no more
    tasks = json.loads((out / "summary.json").read_text())["tasks"]
    assert len(tasks) == 3
    reasons = [t["reason"] for t in tasks]
    assert sum("could not download the platform" in r for r in reasons) == 3, reasons
    assert (
        sum("an earlier build of this run found that pio cannot reach its platform" in r for r in reasons)
        == 2
    )


def test_run_checks_the_ports_before_building(tmp_path: Path, fake_tools: dict[str, object]) -> None:
    """FAKED: `pio` (the stand-in; it must not be called). A board whose port does not exist takes no
    work: the run ends at once, nothing is built, and the tasks say the port is missing."""
    plan, inv = _offline_bench(tmp_path, str(tmp_path / "ttyUSB-not-there"))
    out = tmp_path / "out"
    env = _env(fake_tools)
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(plan), "-i", str(inv), "--out", str(out),
         "--lock-dir", str(tmp_path / "locks"), "--cache-dir", str(tmp_path / "cache"), "--no-step-summary"],
        env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == ExitCode.INFRASTRUCTURE, done.stderr[-2000:]
    assert _calls(fake_tools) == []
    doc = json.loads((out / "summary.json").read_text())
    assert "port missing when the run started" in doc["boards"][0]["reason"]
    assert all(t["verdict"] == "infrastructure_error" for t in doc["tasks"])


def test_flash_and_compare_refuses_a_sim_port_for_a_real_board(
    tmp_path: Path, fake_tools: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKED: `pio` (the stand-in; it must not be called). A real board with a sim:// port spent two
    minutes in `pio` before failing: it is a usage error before anything is built."""
    for k, v in _env(fake_tools, FAKE_TOOL_MODE="offline").items():
        monkeypatch.setenv(k, v)
    args = ["flash-and-compare", str(MODELS / "cnn_classifier_11.tflite"), "--input",
            str(INPUTS / "cnn_classifier_11.png"), "--board", "esp32s3-devkitc-1-n8r8", "--port", "sim://x",
            "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == ExitCode.USAGE
    assert _calls(fake_tools) == []
    doc = json.loads((tmp_path / "o" / "report.json").read_text())
    assert "is a real board, but --port sim://x is a simulated board's" in " ".join(doc["errors"])


def test_a_project_naming_an_unknown_chip_is_refused_before_any_build(
    tmp_path: Path, fake_tools: dict[str, object]
) -> None:
    """build_project refuses a manifest chip without a CHIPS row before any tool runs: what lets
    project_description (and the rest of the build) index CHIPS without a fallback. Faked: pio."""
    from harness.manifest import read_manifest, write_manifest

    opt, _ = _project(tmp_path)
    manifest = read_manifest(opt)
    board_def = {**manifest["board_def"], "chip": "esp99"}
    write_manifest(opt, {**manifest, "chip": "esp99", "board_def": board_def})
    with pytest.raises(UsageError, match="unknown chip 'esp99'"):
        b.build_project(opt, cache_dir=tmp_path / "cache", env=_env(fake_tools))
    assert _calls(fake_tools) == []
