"""The native target end to end against the stand-in component tree (tests/data/native_components).

What is real: the generated firmware (app_main.cc, the C emitter), the native driver running real CMake
and the host compiler over the components' own CMakeLists.txt, the ESP-IDF stand-ins, the native://
port running the program, the console capture, parser, classifier, comparison, --tap analysis, the
host TFLM reference, the runner and the reports. What is faked: the component sources are a labelled
TEST FIXTURE (same layout and entry points as esp-tflite-micro and esp-nn, trivial kernels), since CI
has no upstream sources; faults are injected into its optimized kernel on purpose.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import jsonschema
import pytest
from native_fixture import (
    COMPONENTS,
    faulty_components,
    make_mirror,
    write_input,
    write_model,
    write_refused_input,
    write_refused_model,
)
from sim_helpers import read_until_line

from harness.cli import main
from harness.errors import ExitCode
from harness.firmware.build import build_project
from harness.firmware.generate import generate_projects, read_manifest
from harness.firmware.native.project import NativeOptions
from harness.flows.dataset import DatasetOptions
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.protocol.capture import parse_capture

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_cc,
    pytest.mark.skipif(
        shutil.which("cmake") is None or shutil.which("c++") is None,
        reason="needs cmake and a host C++ compiler",
    ),
]
SCHEMA = json.loads((ROOT / "docs" / "flash-and-compare-schema.json").read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("native-flow")
    write_model(d / "pool.tflite")
    write_input(d / "in0.npy", seed=7)
    write_input(d / "in1.npy", seed=8)
    (d / "cache").mkdir()
    return d


def _run(work: Path, out: str, components: Path = COMPONENTS, **kw: object) -> object:
    native = NativeOptions(components_dir=components, sanitize=bool(kw.pop("sanitize", False)))
    return flash_and_compare(
        work / "pool.tflite",
        [work / "in0.npy"],
        board=str(kw.pop("board", "native-esp32")),
        port=kw.pop("port", None),  # type: ignore[arg-type]
        out_dir=work / out,
        options=JobOptions(cache_dir=work / "cache", native=native, allow_untested=True, **kw),  # type: ignore[arg-type]
    )


def _has_m32() -> bool:
    probe = subprocess.run(
        ["c++", "-m32", "-x", "c++", "-", "-o", "/dev/null"], input=b"int main(){}", capture_output=True
    )
    return probe.returncode == 0


def test_fixture_firmware_matches_the_host_reference_and_says_native(work: Path) -> None:
    res = _run(work, "match", html=work / "match.html")
    assert res.exit_code == ExitCode.MATCH, res.errors  # type: ignore[attr-defined]
    assert "NATIVE: the generated firmware compiled for this PC" in (work / "match.html").read_text()
    doc = json.loads((work / "match" / "report.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["simulated"] is False and doc["native"]["bits"] == 64
    assert "generic C kernels" in doc["native"]["meaning"] and "S3/P4 assembly" in doc["native"]["meaning"]
    for v in ("optimized", "ansi"):
        reported = doc["native"]["reported"][v]
        assert reported["native_bits"] == "64" and reported["native_sanitize"] == "none"
        assert reported["tflm"] == "0.0.1" and reported["idf"] == "native-standins-1"
        assert reported["tflm_from"] == "manifest"  # --components-dir: the component's own version line
        assert doc["variants"][v]["flash"]["chip"] == "native" and doc["variants"][v]["capture_valid"]
    assert {s["label"] for s in doc["comparison"]["sources"]} == {"optimized", "ansi", "reference"}
    assert (
        doc["variants"]["optimized"]["nn_mode"] == "optimized"
        and doc["variants"]["ansi"]["nn_mode"] == "ansi_c"
    )
    log = (work / "match" / "logs" / "build-optimized.log").read_text()
    assert "the project pins 1.3.8" in log  # fixture 0.0.1 built where 1.3.8 is pinned: said, not hidden
    again = _run(work, "match-again")
    assert again.exit_code == ExitCode.MATCH  # type: ignore[attr-defined]
    assert all(r.build_cache_hit for r in again.variants.values())  # type: ignore[attr-defined]


def _written(doc: dict) -> int:
    return sum(
        r["bytes_written"] for v in doc["variants"].values() for r in (v["flash"] or {}).get("regions", [])
    )


def test_the_resident_loop_on_a_native_board_flashes_once_and_streams(work: Path) -> None:
    """Both programs go to their app slots of one native board with the model partition; the ANSI C app
    is reached by the running app's slot switch (BOOT: otadata, esp_restart), inputs and outputs cross
    stdin/stdout as binary frames. A second input rewrites nothing; a dataset of random inputs drawn by
    the firmware itself streams through the same flashed board."""
    port = f"native://loop-{uuid.uuid4().hex[:8]}?flash=4MB"
    first = _run(work, "loop-1", port=port)
    assert first.exit_code == ExitCode.MATCH, first.errors  # type: ignore[attr-defined]
    doc = json.loads((work / "loop-1" / "report.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    regions = {(r["role"], r["offset"]) for v in doc["variants"].values() for r in v["flash"]["regions"]}
    assert {("app", 0x20000), ("app", 0x120000), ("model", 0x220000)} <= regions
    assert _written(doc) > 0
    serial_ansi = (work / "loop-1" / "logs" / "serial-ansi.log").read_bytes()
    assert b"Loaded app from partition at offset 0x120000 (ota_1)" in serial_ansi  # the slot switch
    link = doc["link"]  # the input went down as frames (a text session: the records come back as text)
    assert link["tx_payload"] >= 2 * 64 and link["frames_sent"] >= 4 and link["damaged_frames"] == 0

    # another input, the same board: nothing rebuilt, nothing written
    second = flash_and_compare(
        work / "pool.tflite",
        [work / "in1.npy"],
        board="native-esp32",
        out_dir=work / "loop-2",
        port=port,
        options=JobOptions(
            cache_dir=work / "cache", native=NativeOptions(components_dir=COMPONENTS), allow_untested=True
        ),
    )
    assert second.exit_code == ExitCode.MATCH, second.errors
    doc2 = json.loads((work / "loop-2" / "report.json").read_text())
    assert _written(doc2) == 0 and all(r.build_cache_hit for r in second.variants.values())
    from harness.flows.resident import FLASH_SKIPPED  # the programs' HELLO hashes: no install session at all

    assert {v["flash"].get("skipped") for v in doc2["variants"].values()} == {FLASH_SKIPPED}

    data = flash_and_compare(
        work / "pool.tflite",
        [],
        board="native-esp32",
        out_dir=work / "loop-ds",
        port=port,
        options=JobOptions(
            cache_dir=work / "cache",
            native=NativeOptions(components_dir=COMPONENTS),
            allow_untested=True,
            dataset=DatasetOptions(random_inputs=12, seed=5, results="crc"),
        ),
    )
    assert data.exit_code == ExitCode.MATCH, data.errors
    ds = json.loads((work / "loop-ds" / "report.json").read_text())
    jsonschema.validate(ds, SCHEMA)
    a = ds["dataset"]["analysis"]
    assert a["verdicts"] == {"match": 12} and a["agreement"]["optimized_vs_host"]["bit_exact"] == 12
    assert all(s["tx_payload"] == 0 for s in ds["dataset"]["link"].values())  # drawn on the device
    assert _written(ds) == 0


def test_a_native_board_keeps_uploaded_inputs_across_the_slot_switch(work: Path) -> None:
    """A dataset of files: the optimized program keeps each input in its EXT_RAM_NOINIT_ATTR memory, which
    the stand-ins carry across esp_restart() (the slot switch); the ANSI C program runs them from there
    (no upload). A cold boot (the board reset) starts with noise: nothing is kept, everything uploaded."""
    import numpy as np

    x = np.random.default_rng(3).integers(-128, 128, (6, 1, 8, 8, 3), dtype=np.int8)
    np.savez(work / "six.npz", x=x)
    port = f"native://keep-{uuid.uuid4().hex[:8]}?flash=4MB"
    for k in range(2):  # the second check starts with a reset: a cold boot of its first variant
        res = flash_and_compare(
            work / "pool.tflite", [], board="native-esp32", out_dir=work / f"keep-{k}", port=port,
            options=JobOptions(cache_dir=work / "cache", native=NativeOptions(components_dir=COMPONENTS),
                               allow_untested=True, dataset=DatasetOptions(source=work / "six.npz")),
        )  # fmt: skip
        assert res.exit_code == ExitCode.MATCH, res.errors
        doc = json.loads((work / f"keep-{k}" / "report.json").read_text())
        jsonschema.validate(doc, SCHEMA)
        assert doc["dataset"]["analysis"]["verdicts"] == {"match": 6}
        # whichever variant runs first (the board's running slot) uploads; the other runs what it kept
        first, second = sorted(doc["dataset"]["link"].values(), key=lambda x: x["kept_runs"])
        assert first["tx_payload"] == 6 * 192 and first["kept_runs"] == 0
        assert second["tx_payload"] == 0 and second["kept_runs"] == 6 and second["kept_fallbacks"] == 0


def test_a_second_model_reuses_the_compiled_libraries(work: Path, tmp_path: Path) -> None:
    _run(work, "warm")  # the trees exist (or are made here)
    projects = generate_projects(
        work / "pool.tflite", [work / "in1.npy"], "native-esp32", out_dir=tmp_path / "p"
    )
    res = build_project(
        projects[0].path, cache_dir=work / "cache", native=NativeOptions(components_dir=COMPONENTS)
    )
    info = json.loads(res.flasher_args.read_text())
    assert res.builder == "native" and not res.cache_hit and info["reused_libraries"] is True
    assert "libraries already built, compiling main/" in res.log_path.read_text()  # type: ignore[union-attr]
    assert res.app_bin.stat().st_mode & 0o111
    # laid out as on a chip: the table, otadata, the program in the optimized slot (ota_0), the model
    roles = {a.role: a.offset for a in res.artifacts}
    assert set(roles) == {"partition-table", "otadata", "app", "model"}
    assert roles["app"] == 0x20000 and res.artifact("app").path == res.app_bin  # type: ignore[union-attr]
    resolved = read_manifest(projects[0].path)["resolved"]
    assert resolved["native"] and resolved["components"] == {
        "espressif/esp-nn": "0.0.1",
        "espressif/esp-tflite-micro": "0.0.1",
    }


def test_trees_survive_a_moved_esp_check_install(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree made by one esp-check install is reused by another at a different path (a new venv, an
    upgrade with the same stand-ins): CMake's source directory is the tree's own copy of the
    stand-ins, and a tree configured from elsewhere (trees of earlier esp-checks) is configured anew."""
    from harness.firmware.native import driver

    _run(work, "warm")
    moved = tmp_path / "site-packages" / "standins"
    shutil.copytree(driver.STANDINS_DIR, moved)
    monkeypatch.setattr(driver, "STANDINS_DIR", moved)  # the same content at another install path
    write_input(tmp_path / "in11.npy", seed=11)  # a project of its own: the program cache misses
    projects = generate_projects(
        work / "pool.tflite", [tmp_path / "in11.npy"], "native-esp32", out_dir=tmp_path / "p"
    )
    res = build_project(
        projects[0].path, cache_dir=work / "cache", native=NativeOptions(components_dir=COMPONENTS)
    )
    assert not res.cache_hit and json.loads(res.flasher_args.read_text())["reused_libraries"] is True
    tree_caches = list((work / "cache").rglob("build/CMakeCache.txt"))
    assert tree_caches
    # old trees configured straight from an installed package's stand-ins are configured afresh
    for cache in tree_caches:
        text = cache.read_text()
        home = next(ln for ln in text.splitlines() if ln.startswith("CMAKE_HOME_DIRECTORY:"))
        cache.write_text(text.replace(home, f"CMAKE_HOME_DIRECTORY:INTERNAL={tmp_path / 'gone'}"))
    write_input(tmp_path / "in12.npy", seed=12)  # again a new project, on the old trees
    third = generate_projects(
        work / "pool.tflite", [tmp_path / "in12.npy"], "native-esp32", out_dir=tmp_path / "q"
    )
    again = build_project(
        third[0].path, cache_dir=work / "cache", native=NativeOptions(components_dir=COMPONENTS)
    )
    assert not again.cache_hit
    assert again.builder == "native" and again.app_bin.is_file()


def test_an_optimized_kernel_off_by_one_is_a_mismatch_and_tap_names_the_op(
    work: Path, tmp_path: Path
) -> None:
    comps = faulty_components(tmp_path / "comps", "off_by_one")
    res = _run(work, "offbyone", comps, tap=True)
    assert res.exit_code == ExitCode.MISMATCH  # type: ignore[attr-defined]
    culprit = res.tap.culprit  # type: ignore[attr-defined]
    assert culprit is not None and culprit.op == 0 and culprit.opcode == "MAX_POOL_2D"


def test_a_scratch_overrun_under_the_sanitizer_is_a_firmware_fault(work: Path, tmp_path: Path) -> None:
    comps = faulty_components(tmp_path / "comps", "scratch_overrun")
    plain = _run(work, "overrun-plain", comps)
    assert plain.exit_code == ExitCode.MATCH  # type: ignore[attr-defined]  # invisible without a sanitizer
    res = _run(work, "overrun", comps, sanitize=True)
    assert res.exit_code == ExitCode.FIRMWARE_FAULT  # type: ignore[attr-defined]
    doc = json.loads((work / "overrun" / "report.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    (finding,) = [f for f in doc["variants"]["optimized"]["findings"] if f["kind"] == "sanitizer"]
    assert finding["details"]["error"] == "heap-buffer-overflow"
    assert finding["details"]["access"].startswith("WRITE of size 1")
    assert finding["details"]["frames"][0].startswith("esp_nn_max_pool_s8_opt")
    assert "esp_nn_max_pool_opt.c" in finding["message"]
    assert doc["native"]["reported"]["ansi"]["native_sanitize"] == "address+undefined"
    assert doc["variants"]["ansi"]["findings"] == [] and doc["variants"]["ansi"]["capture_valid"]


def test_undefined_behaviour_under_the_sanitizer_is_a_firmware_fault(work: Path, tmp_path: Path) -> None:
    comps = faulty_components(tmp_path / "comps", "signed_overflow")
    res = _run(work, "ubsan", comps, sanitize=True)
    assert res.exit_code == ExitCode.FIRMWARE_FAULT  # type: ignore[attr-defined]
    findings = res.variants["optimized"].findings  # type: ignore[attr-defined]
    (f,) = [f for f in findings if f["kind"] == "sanitizer"]
    assert f["details"]["sanitizer"] == "UndefinedBehaviorSanitizer"
    assert "signed integer overflow" in f["details"]["error"]
    assert (
        f["details"]["location"].endswith("esp_nn_max_pool_opt.c:36")
        or "esp_nn_max_pool_opt.c" in f["message"]
    )


def test_a_crash_without_sanitizer_is_a_firmware_fault_named_by_its_signal(
    work: Path, tmp_path: Path
) -> None:
    comps = faulty_components(tmp_path / "comps", "segfault")
    res = _run(work, "segv", comps)
    assert res.exit_code == ExitCode.FIRMWARE_FAULT  # type: ignore[attr-defined]
    kinds = [f["kind"] for f in res.variants["optimized"].findings]  # type: ignore[attr-defined]
    assert kinds[0] == "native_exit" and set(kinds) <= {"native_exit", "corrupted"}  # (no END record)
    assert res.variants["optimized"].findings[0]["details"]["signal_name"] == "SIGSEGV"  # type: ignore[attr-defined]


def test_32_bit_build(work: Path) -> None:
    if not _has_m32():
        pytest.skip("the host toolchain cannot build -m32 programs (apt install gcc-multilib g++-multilib)")
    res = _run(work, "m32", board="native-esp32-m32")
    assert res.exit_code == ExitCode.MATCH  # type: ignore[attr-defined]
    assert res.native["bits"] == 32  # type: ignore[attr-defined]
    assert {r["native_bits"] for r in res.native["reported"].values()} == {"32"}  # type: ignore[attr-defined]


def test_default_sources_come_from_the_component_manager(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("idf_component_manager")
    (tmp_path / "pack").mkdir()
    mirror = make_mirror(tmp_path / "mirror", tmp_path / "pack")
    monkeypatch.setenv("IDF_COMPONENT_LOCAL_STORAGE_URL", mirror.as_uri())
    monkeypatch.setenv("IDF_COMPONENT_REGISTRY_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("IDF_COMPONENT_CACHE_PATH", str(tmp_path / "cm-cache"))
    monkeypatch.delenv("ESP_CHECK_COMPONENTS_DIR", raising=False)
    projects = generate_projects(
        work / "pool.tflite", [work / "in0.npy"], "native-esp32", out_dir=tmp_path / "p",
        tflm_version="0.0.1", espnn_version="0.0.1",
    )  # fmt: skip
    res = build_project(projects[0].path, cache_dir=tmp_path / "cache")
    info = json.loads(res.flasher_args.read_text())
    assert [(c["name"], c["version"], c["origin"]) for c in info["components"]] == [
        ("espressif__esp-nn", "0.0.1", "component-manager"),
        ("espressif__esp-tflite-micro", "0.0.1", "component-manager"),
    ]
    assert info["warnings"] == []  # exactly the pinned versions
    # main/CMakeLists.txt read them from the component manager's dependencies.lock, as in ESP-IDF
    # run by hand (no native board: no flash image, so no model partition), the resident firmware prints
    # its identity and the start-up error record, then waits for commands: stop it after that record
    # (read until it comes, not for a fixed time a loaded machine can overrun)
    proc = subprocess.Popen([str(res.app_bin)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        out = read_until_line(proc, b" ERROR ")
    finally:
        proc.kill()
        proc.communicate()
    cap = parse_capture(out)
    assert [e.stage for e in cap.errors] == ["model"]  # the model partition is missing, and said
    assert cap.info["tflm"] == "0.0.1" and cap.info["tflm_from"] == "lock:service"
    assert cap.info["espnn_from"] == "lock:service" and cap.info["native_bits"] == "64"


def test_cli_and_runner_say_native(work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["flash-and-compare", str(work / "pool.tflite"), "--input", str(work / "in0.npy"), "--board",
         "native-esp32", "--components-dir", str(COMPONENTS), "--cache-dir", str(work / "cache"),
         "--allow-untested", "--out", str(tmp_path / "cli")],
    )  # fmt: skip
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())  # rich wraps long lines
    assert code == 0, text
    assert "NATIVE, 64-bit: no chip was used" in text and "generic C kernels" in text
    plan = tmp_path / "plan.toml"
    plan.write_text(
        f'[defaults]\ncomparisons = ["optimized-vs-ansi", "each-vs-host"]\n'
        f'timeouts = {{ capture_total = 60, capture_silence = 10 }}\n\n[[job]]\nname = "native"\n'
        f'models = ["{work / "pool.tflite"}"]\ninputs = ["{work / "in0.npy"}", "{work / "in1.npy"}"]\n'
        f'boards = ["native-esp32"]\nallow_untested = true\n'  # ESP-NN maps its max pool to ANSI C on esp32
    )
    bench = tmp_path / "bench.toml"
    bench.write_text('[[board]]\nname = "pc-1"\ntype = "native-esp32"\nport = "native://bench-pc-1"\n')
    code = main(
        ["run", str(plan), "--inventory", str(bench), "--out", str(tmp_path / "run"), "--cache-dir",
         str(work / "cache"), "--components-dir", str(COMPONENTS), "--lock-dir", str(tmp_path / "locks"),
         "--no-step-summary"],
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    jsonschema.validate(summary, json.loads((ROOT / "docs" / "run-summary-schema.json").read_text()))
    assert summary["native"] is True and summary["simulated"] is False
    assert summary["counts"]["tasks"] == 1 and summary["counts"]["match"] == 1  # both inputs in one firmware


def test_a_refused_host_reference_still_runs_both_variants_and_is_never_a_match(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TFLM's reference aborts on a 1024-entry softmax row near its maximum; the fixture's kernels do not.

    Both variants run; they agree (exit 1, "host reference refused", their values given), or, with a
    fault injected into the optimized max pool (output 0), they disagree: still exit 1, said so.
    """
    model = write_refused_model(tmp_path / "softmax.tflite")
    inp = write_refused_input(tmp_path / "flat.npy")
    args = ["flash-and-compare", str(model), "--input", str(inp), "--board", "native-esp32",
            "--components-dir", str(COMPONENTS), "--cache-dir", str(work / "cache"),
            "--allow-untested"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "agree")]) == ExitCode.MISMATCH
    printed = " ".join(capsys.readouterr())
    assert "HOST REFERENCE REFUSED" in printed and "verdict: mismatch (exit 1)" in printed
    doc = json.loads((tmp_path / "agree" / "report.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    refused = doc["reference_refused"]
    assert doc["exit_code"] == 1 and refused["variants_agree"] is True and refused["mismatched"] == 0
    assert "optimized and ANSI C agree" in refused["summary"] and refused["reference_run"] == 0
    for v in ("optimized", "ansi"):  # the softmax output, as the fixture kernel computes it, is printed
        probs = next(x for x in refused["values"][v] if x["output"] == 1)
        assert probs == {"run": 0, "output": 1, "count": 1024, "distinct": 1, "values": [-128]}
    assert {s["label"] for s in doc["comparison"]["sources"]} == {"optimized", "ansi"}
    assert [s["status"] for s in doc["stages"] if s["stage"] == "reference"] == ["failed"]

    broken = faulty_components(tmp_path / "off_by_one", "off_by_one")
    res = flash_and_compare(
        model,
        [inp],
        board="native-esp32",
        out_dir=tmp_path / "disagree",
        options=JobOptions(
            cache_dir=work / "cache", native=NativeOptions(components_dir=broken), allow_untested=True
        ),
    )
    assert res.exit_code == ExitCode.MISMATCH and res.reference_refused is not None
    assert res.reference_refused["variants_agree"] is False and res.reference_refused["mismatched"] > 0
    assert "DISAGREE" in res.reference_refused["summary"]
