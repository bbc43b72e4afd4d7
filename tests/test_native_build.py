"""The native build's pieces: the Kconfig stand-in, the toolchain flags, the command lines, the cache keys,
finding and snapshotting component sources, and the ESP-IDF component manager's download path.

What is real: the host compiler (toolchain probe), the ESP-IDF component manager (its own
``prepare_dependencies`` entry point and its ``compote component pack``) run as subprocesses, a local
component mirror in the layout ``compote registry sync`` writes. What is faked: nothing is faked; the
registry is simply unreachable (a closed local port), as it is in CI.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_fixture import COMPONENTS, make_mirror

from harness import children
from harness.errors import BuildError, ExitCode, UsageError
from harness.firmware.native import components as comps
from harness.firmware.native.config import parse_defaults, resolve, sdkconfig_cmake, sdkconfig_h
from harness.firmware.native.driver import build_command, configure_command, tree_key, tree_lock
from harness.firmware.native.toolchain import Toolchain, find_toolchain
from harness.firmware.toolrun import notes_only, run_streaming

DEFAULTS = """# comment
CONFIG_IDF_TARGET="esp32"
CONFIG_NN_ANSI_C=y
CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_240=y
CONFIG_ESP_MAIN_TASK_STACK_SIZE=16384
CONFIG_PARTITION_TABLE_OFFSET=0x8000
# CONFIG_ESP_TASK_WDT_CHECK_IDLE_TASK_CPU0 is not set
CONFIG_PARTITION_TABLE_CUSTOM_FILENAME="partitions.csv"
"""


def test_kconfig_standin_derives_what_kconfig_would() -> None:
    cfg = resolve(parse_defaults(DEFAULTS))
    assert cfg["CONFIG_IDF_TARGET_ESP32"] == "y"
    assert cfg["CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ"] == "240"
    assert cfg["CONFIG_NN_ANSI_C"] == "y" and "CONFIG_NN_OPTIMIZED" not in cfg
    assert cfg["CONFIG_NN_OPTIMIZATIONS"] == "0"
    assert "CONFIG_ESP_TASK_WDT_CHECK_IDLE_TASK_CPU0" not in cfg  # "is not set" is not defined
    h = sdkconfig_h(cfg)
    assert "#define CONFIG_NN_ANSI_C 1\n" in h and '#define CONFIG_IDF_TARGET "esp32"\n' in h
    assert "#define CONFIG_PARTITION_TABLE_OFFSET 0x8000\n" in h
    assert '#define CONFIG_PARTITION_TABLE_CUSTOM_FILENAME "partitions.csv"\n' in h
    cm = sdkconfig_cmake(cfg, "5.5.3")
    assert 'set(CONFIG_IDF_TARGET_ESP32 "y")' in cm and "set(IDF_VERSION_MAJOR 5)" in cm
    assert "set(IDF_VERSION_MINOR 5)" in cm and 'set(IDF_TARGET "esp32")' in cm


def test_esp_nn_default_choice_is_optimized_and_both_is_refused() -> None:
    cfg = resolve({"CONFIG_IDF_TARGET": '"esp32c3"'})
    assert (
        cfg["CONFIG_NN_OPTIMIZED"] == "y" and cfg["CONFIG_NN_OPTIMIZATIONS"] == "1"
    )  # esp-nn's Kconfig default
    assert cfg["CONFIG_IDF_TARGET_ESP32C3"] == "y"
    with pytest.raises(BuildError, match="both"):
        resolve({"CONFIG_IDF_TARGET": '"esp32"', "CONFIG_NN_OPTIMIZED": "y", "CONFIG_NN_ANSI_C": "y"})
    with pytest.raises(BuildError, match="CONFIG_IDF_TARGET"):
        resolve({"CONFIG_NN_OPTIMIZED": "y"})


def test_string_values_are_unescaped_as_kconfgen_reads_them_and_escaped_for_c_and_cmake() -> None:
    # kconfgen writes a string escaped (\" and \\) and reads it back unescaped (kconfiglib's unescape):
    # CONFIG_X's value is a"b;$c and CONFIG_W's is c:\w, so sdkconfig.h has the literals kconfgen writes
    cfg = resolve({"CONFIG_IDF_TARGET": '"esp32"', "CONFIG_X": '"a\\"b;$c"', "CONFIG_W": '"c:\\\\w"'})
    h = sdkconfig_h(cfg)
    assert '#define CONFIG_X "a\\"b;$c"\n' in h and '#define CONFIG_W "c:\\\\w"\n' in h
    cm = sdkconfig_cmake(cfg, "5.1")
    assert 'set(CONFIG_X "a\\"b\\;\\$c")' in cm  # ; $ escaped too for CMake
    assert 'set(CONFIG_W "c:\\\\w")' in cm
    with pytest.raises(BuildError, match="malformed string"):
        parse_defaults('CONFIG_IDF_TARGET="esp32"\nCONFIG_X="a"b"\n')  # kconfgen ignores this assignment
    with pytest.raises(BuildError, match="printable"):
        sdkconfig_h({"CONFIG_Y": '"\x01"'})


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=400))
def test_parse_defaults_never_crashes_on_garbage(text: str) -> None:
    try:
        out = parse_defaults(text)
    except BuildError as exc:
        assert exc.exit_code == ExitCode.INFRASTRUCTURE
        return
    assert all(k.startswith("CONFIG_") for k in out)


TC = Toolchain("/usr/bin/cc", "/usr/bin/c++", "/usr/bin/cmake", "Ninja", "gcc 12", "x86_64-linux-gnu", 64)


def test_flags_for_word_size_and_sanitizers() -> None:
    assert TC.common_flags == ["-m64", "-O2"]
    assert TC.cxx_flags == ["-m64", "-O2", "-fno-exceptions", "-fno-rtti"]
    san = dataclasses.replace(TC, bits=32, sanitize=("address", "undefined"))
    assert san.common_flags[:2] == ["-m32", "-O2"]
    assert "-fsanitize=address,undefined" in san.common_flags
    assert "-fno-sanitize-recover=all" in san.common_flags  # the first report ends the program
    assert "-fno-sanitize=shift-base" in san.common_flags  # GCC defines it; esp-nn relies on it
    assert san.sanitize_label == "address+undefined" and TC.sanitize_label == "none"


def _component(tmp: Path, name: str, text: str = "x") -> comps.ComponentSource:
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "CMakeLists.txt").write_text(text)
    return comps.ComponentSource(name, d, "1.0", "components-dir", comps.tree_sha256(d))


def test_library_key_covers_sources_config_compiler_flags_and_idf_version(tmp_path: Path) -> None:
    a = _component(tmp_path, "a")
    cfg = resolve(parse_defaults(DEFAULTS))
    base = tree_key([a], cfg, "5.5.3", TC)
    assert tree_key([a], cfg, "5.5.3", TC) == base
    changed = [
        tree_key([_component(tmp_path / "2", "a", "y")], cfg, "5.5.3", TC),  # component content
        tree_key([a], {**cfg, "CONFIG_NN_OPTIMIZED": "y"}, "5.5.3", TC),  # configuration (variant)
        tree_key([a], cfg, "5.1.0", TC),  # pinned ESP-IDF version (component CMake branches)
        tree_key([a], cfg, "5.5.3", dataclasses.replace(TC, bits=32)),  # word size
        tree_key([a], cfg, "5.5.3", dataclasses.replace(TC, sanitize=("address", "undefined"))),
        tree_key([a], cfg, "5.5.3", dataclasses.replace(TC, version="gcc 13")),  # compiler identity
        tree_key([a], cfg, "5.5.3", dataclasses.replace(TC, cxx="/usr/bin/clang++")),
    ]
    assert len({base, *changed}) == len(changed) + 1
    with pytest.raises(ValueError, match="snapshot"):
        tree_key([dataclasses.replace(a, sha256="")], cfg, "5.5.3", TC)


def test_command_lines_are_argument_lists(tmp_path: Path) -> None:
    a = _component(tmp_path, "espressif__esp-nn")
    b = _component(tmp_path, "espressif__esp-tflite-micro")
    argv = configure_command(dataclasses.replace(TC, bits=32), tmp_path / "tree", tmp_path / "main", [a, b])
    assert argv[:2] == ["/usr/bin/cmake", "-S"] and "-G" in argv and argv[argv.index("-G") + 1] == "Ninja"
    assert f"-DESP_CHECK_COMPONENTS=espressif__esp-nn={a.path};espressif__esp-tflite-micro={b.path}" in argv
    assert "-DCMAKE_C_FLAGS=-m32 -O2" in argv and "-DCMAKE_EXE_LINKER_FLAGS=-m32 -O2" in argv
    assert f"-DESP_CHECK_MAIN_DIR={tmp_path / 'main'}" in argv
    assert "-DESP_CHECK_NATIVE_HOST=x86_64-linux-gnu" in argv and "-DESP_CHECK_NATIVE_SANITIZE=none" in argv
    assert build_command(TC, tmp_path / "tree", 3) == [
        "/usr/bin/cmake", "--build", str(tmp_path / "tree" / "build"), "--target", "esp_check_native_app",
        "--parallel", "3",
    ]  # fmt: skip


@pytest.mark.needs_cc
def test_toolchain_probe_links_a_program_or_explains(tmp_path: Path) -> None:
    if shutil.which("cmake") is None or shutil.which("cc") is None or shutil.which("c++") is None:
        pytest.skip("no cmake or no host compiler")
    tc = find_toolchain(64, False)
    assert tc.bits == 64 and tc.machine and tc.generator in ("Ninja", "Unix Makefiles")
    assert tc.version.count(" / ") == 1  # C and C++ compiler identities, both in the cache key
    only_compilers = tmp_path / "bin"
    only_compilers.mkdir()
    for tool in ("cc", "c++", "as", "ld"):
        found = shutil.which(tool)
        if found:
            (only_compilers / tool).symlink_to(found)
    with pytest.raises(BuildError, match="CMake is not installed") as exc:
        find_toolchain(64, False, env={"PATH": str(only_compilers)})
    assert exc.value.hint and "cmake" in exc.value.hint


def test_missing_compiler_or_cmake_is_an_infrastructure_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as exc:
        find_toolchain(64, False, env={"PATH": str(tmp_path)})
    assert exc.value.exit_code == ExitCode.INFRASTRUCTURE and "compiler" in str(exc.value)
    assert exc.value.hint and "install" in exc.value.hint
    with pytest.raises(BuildError, match="32- or 64-bit"):
        find_toolchain(16, False)


def test_find_components_by_short_name_build_name_or_managed_components(tmp_path: Path) -> None:
    found = comps.find_components(COMPONENTS)
    assert [c.name for c in found] == ["espressif__esp-nn", "espressif__esp-tflite-micro"]
    assert [c.version for c in found] == ["0.0.1", "0.0.1"] and {c.origin for c in found} == {
        "components-dir"
    }
    project = tmp_path / "proj"
    shutil.copytree(COMPONENTS / "esp-nn", project / "managed_components" / "espressif__esp-nn")
    shutil.copytree(
        COMPONENTS / "esp-tflite-micro", project / "managed_components" / "espressif__esp-tflite-micro"
    )
    assert [c.path.name for c in comps.find_components(project)] == [
        "espressif__esp-nn",
        "espressif__esp-tflite-micro",
    ]
    (tmp_path / "only" / "esp-nn").mkdir(parents=True)
    (tmp_path / "only" / "esp-nn" / "CMakeLists.txt").write_text("")
    # a wrong --components-dir is the user's input: exit 2, not 3
    with pytest.raises(UsageError, match=r"esp-tflite-micro.*found: esp-nn") as exc:
        comps.find_components(tmp_path / "only")
    assert exc.value.hint and "--components-dir" in exc.value.hint
    with pytest.raises(UsageError, match="not a directory") as missing:
        comps.find_components(tmp_path / "missing")
    assert missing.value.exit_code == ExitCode.USAGE and not isinstance(missing.value, BuildError)


def test_version_is_read_from_the_manifest_or_none(tmp_path: Path) -> None:
    (tmp_path / "idf_component.yml").write_text('description: x\nversion: "1.3.8"\n')
    assert comps.component_version(tmp_path) == "1.3.8"
    (tmp_path / "idf_component.yml").write_text("description: a git checkout has no version line\n")
    assert comps.component_version(tmp_path) is None


def test_snapshot_copies_by_content_once_and_skips_vcs(tmp_path: Path) -> None:
    src = tmp_path / "esp-nn"
    shutil.copytree(COMPONENTS / "esp-nn", src)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref")
    before = comps.tree_sha256(src)
    (src / ".git" / "HEAD").write_text("other ref")  # VCS state is not a source
    assert comps.tree_sha256(src) == before
    comp = comps.ComponentSource("espressif__esp-nn", src, "0.0.1", "components-dir")
    (snap,) = comps.snapshot([comp], tmp_path / "root")
    assert snap.sha256 == before and snap.path != src and not (snap.path / ".git").exists()
    assert comps.tree_sha256(snap.path) == before
    (src / "src" / "pooling" / "esp_nn_max_pool_opt.c").write_text("/* edited */\n")
    (snap2,) = comps.snapshot([comp], tmp_path / "root")
    assert snap2.path != snap.path and snap.path.is_dir()  # new content, new snapshot; the old one stays


def test_component_manager_command_is_the_one_esp_idf_runs(tmp_path: Path) -> None:
    argv = comps.component_manager_command(tmp_path / "p", tmp_path / "b")
    assert argv[1:3] == ["-m", "idf_component_manager.prepare_components"]
    assert "prepare_dependencies" in argv and "--managed_components_list_file" in argv
    env = comps.component_manager_env({"PATH": "/bin"}, tmp_path, "5.5.3", "esp32")
    assert env["IDF_VERSION"] == "5.5.3" and env["IDF_TARGET"] == "esp32" and Path(env["IDF_PATH"]).is_dir()
    assert (
        comps.component_manager_env({"IDF_PATH": "/opt/idf"}, tmp_path, "5.5.3", "esp32")["IDF_PATH"]
        == "/opt/idf"
    )


MAIN_MANIFEST = """dependencies:
  idf:
    version: ">=5.1"
  espressif/esp-tflite-micro:
    version: "==0.0.1"
  espressif/esp-nn:
    version: "==0.0.1"
"""


def _download(tmp_path: Path, extra_env: dict[str, str]) -> list[comps.ComponentSource]:
    pytest.importorskip("idf_component_manager")
    manifest = tmp_path / "main" / "idf_component.yml"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(MAIN_MANIFEST)
    log = tmp_path / "build.log"
    env = {
        **os.environ,
        "IDF_COMPONENT_REGISTRY_URL": "http://127.0.0.1:9",  # no registry here (closed port), as in CI
        "IDF_COMPONENT_CACHE_PATH": str(tmp_path / "cm-cache"),
        **extra_env,
    }
    if "IDF_COMPONENT_LOCAL_STORAGE_URL" not in extra_env:
        env.pop("IDF_COMPONENT_LOCAL_STORAGE_URL", None)  # no mirror the user may have configured

    def run(argv: list[str], cwd: Path, e: dict[str, str]) -> tuple[int, list[str]]:
        return run_streaming(argv, cwd=cwd, env=e, log_path=log, on_output=None, timeout=300)

    return comps.download_components(
        manifest, tmp_path / "root", idf_version="5.5.3", target="esp32", run=run, env=env
    )


def test_download_without_registry_fails_at_the_registry_call_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as exc:
        _download(tmp_path, {})
    assert exc.value.exit_code == ExitCode.INFRASTRUCTURE
    assert "component manager could not provide" in str(exc.value)
    assert "connection" in str(exc.value).lower()  # the component manager's own words about the registry
    assert (
        exc.value.hint and "--components-dir" in exc.value.hint and "compote registry sync" in exc.value.hint
    )


def test_download_from_a_local_mirror_gives_the_pinned_components(tmp_path: Path) -> None:
    pytest.importorskip("idf_component_manager")
    (tmp_path / "pack").mkdir()
    mirror = make_mirror(tmp_path / "mirror", tmp_path / "pack")
    got = _download(tmp_path, {"IDF_COMPONENT_LOCAL_STORAGE_URL": mirror.as_uri()})
    assert [(c.name, c.version, c.origin) for c in got] == [
        ("espressif__esp-nn", "0.0.1", "component-manager"),
        ("espressif__esp-tflite-micro", "0.0.1", "component-manager"),
    ]
    for c in got:  # the same sources as the fixture tree the mirror was packed from
        short = comps.FIRMWARE_COMPONENTS[c.name]
        assert (c.path / "CMakeLists.txt").read_text() == (COMPONENTS / short / "CMakeLists.txt").read_text()
    lock = got[0].path.parents[1] / "dependencies.lock"
    assert "espressif/esp-tflite-micro" in lock.read_text()
    # a second resolution of the same pins reuses the download (no component manager run)
    assert _download(tmp_path, {"IDF_COMPONENT_LOCAL_STORAGE_URL": "file:///nonexistent"}) == got


# --- native builds: the build limit counts silence; a limit kills the whole process group at once;
# long builds report ninja's n/N; a build waiting for another's tree lock says on whose. The tools here
# are small Python scripts run as real subprocesses (standing in for cmake/ninja: nothing is faked in
# run_streaming itself).


def _script(tmp: Path, body: str) -> list[str]:
    path = tmp / "tool.py"
    path.write_text("import os, subprocess, sys, time\n" + body, encoding="utf-8")
    return [sys.executable, "-u", str(path)]


def test_the_build_limit_counts_silence_not_total_time(tmp_path: Path) -> None:
    # prints a line every 0.2 s for 2.4 s: longer in all than the 1 s limit, never silent for 1 s
    argv = _script(
        tmp_path, "for k in range(12):\n    print(f'[{k + 1}/12] step', flush=True)\n    time.sleep(0.2)\n"
    )
    rc, tail = run_streaming(
        argv, cwd=tmp_path, env=os.environ, log_path=tmp_path / "l", on_output=None, timeout=1.0
    )
    assert rc == 0 and tail[-1] == "[12/12] step"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has died (only its parent has not reaped it)


def test_a_silent_build_is_killed_with_its_child_processes(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    argv = _script(
        tmp_path,
        "child = subprocess.Popen(['sleep', '120'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "print('compiling', flush=True)\n"
        "time.sleep(120)\n",
    )
    with pytest.raises(BuildError) as exc:
        run_streaming(
            argv, cwd=tmp_path, env=os.environ, log_path=tmp_path / "l", on_output=None, timeout=1.0
        )
    assert "printed nothing for 1 s" in exc.value.message and exc.value.exit_code == ExitCode.INFRASTRUCTURE
    pid = int(pidfile.read_text())
    for _ in range(50):  # SIGKILL is delivered asynchronously: let the kernel finish it
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), "the tool's child (a compiler, say) outlived the limit"


def test_children_kill_takes_the_group_leader_and_its_children(tmp_path: Path) -> None:
    """The one kill rule of the build tools and of esp-check's exit (harness.children.kill): the group
    leader and every process of its group, and a process already gone is no error. Real processes."""
    pidfile = tmp_path / "child.pid"
    argv = _script(
        tmp_path,
        "child = subprocess.Popen(['sleep', '120'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n",
    )
    with subprocess.Popen(argv, start_new_session=True) as proc:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        children.kill(proc, group=True)
        proc.wait()
    pid = int(pidfile.read_text())
    for _ in range(50):  # SIGKILL is delivered asynchronously: let the kernel finish it
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert proc.returncode == -signal.SIGKILL and not _alive(pid)
    children.kill(proc, group=True)  # already gone and reaped: nothing to do, nothing raised


def test_long_builds_report_ninjas_steps(tmp_path: Path) -> None:
    argv = _script(
        tmp_path, "for k in range(1, 4):\n    print(f'[{k}/3] Building C object x{k}.o', flush=True)\n"
    )
    seen: list[str] = []
    run_streaming(
        argv, cwd=tmp_path, env=os.environ, log_path=tmp_path / "l", on_output=seen.append, timeout=None
    )
    notes: list[str] = []
    for line in seen:
        notes_only(notes.append)(line)
    assert notes[0].endswith(tuple(f"step 1/3 (33%, {s} s)" for s in range(5)))
    assert any("step 3/3 (100%" in n for n in notes)


def test_a_build_waiting_for_the_tree_lock_says_on_whose(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path\n"
         "from harness.firmware.native.driver import tree_lock\n"
         f"with tree_lock(Path({str(tree)!r}), Path({str(tmp_path / 'h.log')!r}), None):\n"
         "    print('held', flush=True); sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "held"
    notes: list[str] = []

    def on_output(line: str) -> None:
        notes.append(line)
        holder.stdin.write("release\n")  # the first note came: let the other build finish
        holder.stdin.flush()

    with tree_lock(tree, tmp_path / "build.log", on_output):
        pass
    holder.wait(timeout=60)
    assert len(notes) == 1 and notes[0].startswith(
        "esp-check: waiting for another build of the same native tree"
    )
    assert f"pid {holder.pid} on " in notes[0] and notes[0].split("; lock ")[0].endswith(": -c")  # its argv
    assert notes[0] in (tmp_path / "build.log").read_text()


def test_ccache_is_the_compiler_launcher_when_present(tmp_path: Path) -> None:
    # the optimized and ANSI C trees share most esp-tflite-micro objects through
    # ccache. A directory on PATH with an executable named ccache stands in for an installed one.
    from harness.firmware.native.driver import ccache_env, compiler_launcher

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ccache"
    tool.write_text('#!/bin/sh\nexec "$@"\n')
    tool.chmod(0o755)
    assert compiler_launcher({"PATH": str(bin_dir)}) == [
        f"-DCMAKE_C_COMPILER_LAUNCHER={tool}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={tool}"
    ]  # fmt: skip
    assert compiler_launcher({"PATH": str(bin_dir), "ESP_CHECK_CCACHE": "0"}) == []
    assert compiler_launcher({"PATH": str(tmp_path / "empty")}) == []
    env = ccache_env(tmp_path / "root")
    assert env["CCACHE_BASEDIR"] == str((tmp_path / "root").resolve()) and env["CCACHE_NOHASHDIR"] == "1"
