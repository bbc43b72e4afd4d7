"""Host overhead of one run: each model parsed once, no unused model hex rendering.

Nothing is faked except the board: flash_and_compare runs on the simulated board (``sim://``), the
build through the simulator's builder, the host reference in its real child process.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest
from sim_helpers import HANG_S

from harness.errors import ModelError
from harness.firmware import generate
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.model import loader

MODEL = "cnn_classifier_11.tflite"
INPUT = "inputs/cnn_classifier_11.npy"


@pytest.fixture
def parse_calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """Every real flatbuffer parse of this test, by path (both caches, in memory and on disk, start
    empty)."""
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "parse-cache"))
    calls: list[Path] = []
    real = loader._parse

    def counting(data: bytes, path: Path, *rest: Any) -> Any:
        calls.append(path)
        return real(data, path, *rest)

    monkeypatch.setattr(loader, "_parse", counting)
    if hasattr(loader, "_parsed"):
        monkeypatch.setattr(loader, "_parsed", type(loader._parsed)())
    return calls


def test_a_model_loaded_twice_is_parsed_once(
    models_dir: Path, tmp_path: Path, parse_calls: list[Path]
) -> None:
    a = loader.load_model(models_dir / MODEL)
    copy = tmp_path / "copy.tflite"
    shutil.copyfile(models_dir / MODEL, copy)
    b = loader.load_model(copy)  # same bytes under another name: same facts, its own path
    assert len(parse_calls) == 1
    assert b.path == copy and a.path == models_dir / MODEL
    assert (b.sha256, b.ops, b.inputs, b.outputs) == (a.sha256, a.ops, a.inputs, a.outputs)


def test_a_rewritten_model_is_parsed_again(models_dir: Path, tmp_path: Path, parse_calls: list[Path]) -> None:
    path = tmp_path / "m.tflite"
    shutil.copyfile(models_dir / MODEL, path)
    first = loader.load_model(path)
    shutil.copyfile(models_dir / "op_zoo.tflite", path)  # same path, new content: no stale answer
    second = loader.load_model(path)
    assert len(parse_calls) == 2
    assert second.sha256 != first.sha256 and second.ops != first.ops


def test_a_corrupt_model_is_refused_every_time(
    models_dir: Path, tmp_path: Path, parse_calls: list[Path]
) -> None:
    bad = tmp_path / "bad.tflite"
    bad.write_bytes((models_dir / MODEL).read_bytes()[:2000])
    for _ in range(2):
        with pytest.raises(ModelError):
            loader.load_model(bad)  # errors are not cached as if they were models
    assert len(parse_calls) == 2


def test_the_parse_cache_is_bounded(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch, parse_calls: list[Path]
) -> None:
    monkeypatch.setattr(loader, "_PARSED_MAX", 1)
    loader.load_model(models_dir / MODEL)
    loader.load_model(models_dir / "op_zoo.tflite")
    loader.load_model(models_dir / MODEL)  # evicted by op_zoo: read back from the disk cache
    assert len(loader._parsed) == 1
    assert [p.name for p in parse_calls] == [MODEL, "op_zoo.tflite"]
    monkeypatch.setattr(loader, "_stored", lambda *a: None)  # without the disk cache: parsed again
    loader.load_model(models_dir / "op_zoo.tflite")
    assert [p.name for p in parse_calls] == [MODEL, "op_zoo.tflite", "op_zoo.tflite"]


_FRESH_LOAD = """
import sys
from harness.model import loader
loader._parse = lambda *a: sys.exit("parsed: the stored parse was not used")
info = loader.load_model(sys.argv[1])
print(info.sha256, len(info.ops), sorted(m for m in sys.modules if m.split(".")[0] == "tflite"))
"""


def test_a_repeat_process_reads_the_parse_from_the_disk_cache(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parse_calls: list[Path]
) -> None:
    """One parse per model and parser: the next process reads a small JSON keyed by the model's
    SHA-256 and the parser's id, imports no `tflite` package, and gets the same facts."""
    import subprocess

    for name in (MODEL, "op_zoo.tflite", "unet_mbv2_035_48.tflite"):
        parsed = loader.load_model(models_dir / name)
        monkeypatch.setattr(loader, "_parsed", type(loader._parsed)())  # a new process's memory
        stored = loader.load_model(models_dir / name)
        assert stored == parsed and stored is not parsed
        assert [dict(o.options) for o in stored.ops] == [dict(o.options) for o in parsed.ops]
        assert stored.inputs == parsed.inputs and stored.tensors == parsed.tensors
    assert len(parse_calls) == 3
    env = {**os.environ, "PYTHONPATH": str(Path(loader.__file__).resolve().parents[2])}
    got = subprocess.run(
        [sys.executable, "-c", _FRESH_LOAD, str(models_dir / MODEL)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    info = loader.load_model(models_dir / MODEL)
    assert got.stdout.split() == [info.sha256, str(len(info.ops)), "[]"]


def test_a_stored_parse_of_another_parser_or_a_damaged_one_is_not_used(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch, parse_calls: list[Path]
) -> None:
    first = loader.load_model(models_dir / MODEL)
    fresh = type(loader._parsed)
    monkeypatch.setattr(loader, "_parser_id", lambda: "another-parser")  # an edited parser or op table
    monkeypatch.setattr(loader, "_parsed", fresh())
    assert loader.load_model(models_dir / MODEL) == first and len(parse_calls) == 2
    for entry in loader._info_path(first.sha256).parent.glob("*another-parser.json"):
        entry.write_text(entry.read_text()[:100])  # damaged: parsed again, then stored whole
    for expected in (3, 3):
        monkeypatch.setattr(loader, "_parsed", fresh())
        assert loader.load_model(models_dir / MODEL) == first and len(parse_calls) == expected


def test_flash_and_compare_parses_the_model_once(
    models_dir: Path, tmp_path: Path, parse_calls: list[Path]
) -> None:
    """Flow, generator, arena estimate, host reference and simulated board all read one parse."""
    result = flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        out_dir=tmp_path / "out",
        options=JobOptions(
            cache_dir=tmp_path / "cache", timeouts=StageTimeouts(capture_total=30, capture_silence=3)
        ),
    )
    assert result.exit_code == 0, result
    assert [p.name for p in parse_calls] == [MODEL]


def test_generate_does_not_render_the_model_as_a_c_array(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model goes to its own flash partition; a hex C initializer of it was rendered and unused."""
    rendered: list[bytes] = []
    real = generate._hex_array

    def recording(data: bytes, *args: Any, **kwargs: Any) -> str:
        rendered.append(bytes(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(generate, "_hex_array", recording)
    projects = generate.generate_projects(
        models_dir / MODEL, [models_dir / INPUT], "sim", out_dir=tmp_path / "p"
    )
    model_bytes = (models_dir / MODEL).read_bytes()
    assert len(projects) == 2 and all(p.manifest["model"]["sha256"] for p in projects)
    assert model_bytes not in rendered


def test_templates_are_compiled_once_and_again_when_edited(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jinja's compiled templates are kept in esp-check's cache, keyed by each template's source."""
    templates = tmp_path / "templates"
    shutil.copytree(generate.templates_dir(), templates)
    monkeypatch.setattr(generate, "templates_dir", lambda: templates)
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    compiled: list[str | None] = []
    real = jinja2.Environment.compile

    def counting(self: jinja2.Environment, source: Any, name: str | None = None, *a: Any, **k: Any) -> Any:
        compiled.append(name)
        return real(self, source, name, *a, **k)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)

    def gen(out: str = "p") -> str:  # a new folder renders again (an unchanged one is kept as it is)
        generate.generate_projects(models_dir / MODEL, [models_dir / INPUT], "sim", out_dir=tmp_path / out)
        return (tmp_path / out / "optimized" / "partitions.csv").read_text()

    gen()
    first = len(compiled)
    assert first > 0
    gen("p2")
    assert len(compiled) == first  # the second run rendered everything and compiled nothing
    csv = templates / "project" / "partitions.csv.j2"
    csv.write_text("# edited\n" + csv.read_text())
    assert gen().startswith("# edited\n")  # an edited template is not served stale
    assert compiled[first:] == ["partitions.csv.j2"]


def test_stopping_the_host_reference_kills_its_child(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ends while the reference runs in the background leaves no child behind.

    Faked: the child is a Python process that writes its pid and sleeps (instead of TFLM)."""
    from harness.errors import HostReferenceError
    from harness.model import hostrun, reference

    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    monkeypatch.setattr(hostrun, "_child_argv", lambda job_dir: [sys.executable, "-c", script])
    stop = threading.Event()
    errors: list[BaseException] = []
    x = np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy")

    def run() -> None:
        try:
            reference.run_reference(models_dir / MODEL, [[x]], stop=stop)
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=run)
    th.start()
    for _ in range(600):  # the child has started once it wrote its pid
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    stop.set()
    th.join(60)
    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], HostReferenceError) and "stopped" in str(errors[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_dataset_host_reference_runs_while_the_inputs_stream(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dataset's host reference overlaps the stream and is joined before the verdicts.

    The reference is wrapped to wait (at most 60 s) until the first variant's dataset stage has started:
    if the flow ran the reference before streaming, that never happens while it waits."""
    from harness.flows.dataset import DatasetOptions
    from harness.model import reference

    streaming = threading.Event()
    seen: list[tuple[str, bool]] = []
    real = reference.run_reference

    def waiting(*a: Any, **k: Any) -> Any:
        seen.append((threading.current_thread().name, streaming.wait(60)))
        return real(*a, **k)

    def progress(stage: str, message: str) -> None:
        if stage.startswith("dataset") and message == "started":
            streaming.set()

    monkeypatch.setattr(reference, "run_reference", waiting)
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    result = flash_and_compare(
        models_dir / MODEL,
        [],
        board="sim",
        out_dir=tmp_path / "out",
        progress=progress,
        options=JobOptions(
            cache_dir=tmp_path / "build-cache",
            timeouts=StageTimeouts(capture_total=60, capture_silence=10),
            dataset=DatasetOptions(random_inputs=4, seed=2, results="full"),
        ),
    )
    assert seen == [("host-reference", True)]
    assert result.exit_code == 0, result.errors
    agreement = result.dataset["analysis"]["agreement"]
    assert agreement["optimized_vs_host"]["compared"] == 4  # the host legs were joined and judged


LIST_MODULES = Path(__file__).resolve().parents[1] / "bench" / "list_modules.py"  # writes what a run loaded
# What a repeat flash-and-compare (cached build, cached host reference, the board holding the images)
# must not load, and why (each import costs host CPU on every repeat run).
NOT_ON_A_REPEAT = {
    "tflite_micro": "the reference cache key reads the wheel's metadata; the runtime only runs a model",
    "tflite": "the model's parse is read from the disk cache",
    "esptool": "the flash is skipped (HELLO hashes) and the app slot SHA-256 is stored with the build",
    "rich.status": "no spinner when stderr is not a terminal",
    "numpy.ma": "np.unique's masked-array check, avoided in the classifier",
    "pydantic": "report.json's comparison is built by hand, and the board file's validated form is stored",
    "harness.analysis.report_model": "the compare report's model is the schema's source, not the writer's",
    "harness.firmware.board_file": "the board file's model validates a file not validated before",
    "harness.analysis.tap": "the tap analysis (and its audit, harness.analysis.hybrid) runs with --tap only",
    "harness.flows.tap_run": "the tap flow is imported where --tap runs it",
    # Python 3.10's typing has no NotRequired: there the backport is imported
    **(
        {"typing_extensions": "the report records' TypedDicts take NotRequired from typing"}
        if sys.version_info >= (3, 11)
        else {}
    ),
}


@pytest.mark.slow
def test_a_repeat_cli_run_loads_only_what_it_uses(models_dir: Path, tmp_path: Path) -> None:
    """Real: the CLI in fresh processes, the simulated board served in its own process (RFC 2217, as a
    networked board: its own imports are not esp-check's), the build, the host reference child."""
    import subprocess

    root = str(Path(loader.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "ESP_CHECK_CACHE_DIR": str(tmp_path / "cache")}
    serve = [sys.executable, "-m", "harness.cli", "sim", "serve", "--rfc2217", "--port", "0",
             "--name", "repeat", "--flash", str(tmp_path / "flash.bin")]  # fmt: skip
    with subprocess.Popen(serve, env=env, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            lines = [server.stdout.readline(), server.stdout.readline()]
            url = lines[1].split()[-1]
            assert url.startswith("rfc2217://"), lines
            args = [str(models_dir / MODEL), "--input", str(models_dir / INPUT), "--board", "sim",
                    "--port", url, "--out", str(tmp_path / "out")]  # fmt: skip
            listed = tmp_path / "modules.txt"
            for cmd in (
                [sys.executable, "-m", "harness.cli", "flash-and-compare", *args],  # warms every cache
                [sys.executable, str(LIST_MODULES), str(listed), "flash-and-compare", *args],
            ):
                got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
        finally:
            server.terminate()
            server.wait(HANG_S)
    report = (tmp_path / "out" / "report.json").read_text()
    assert "flash skipped" in report  # the repeat run is the one described above
    loaded = set(listed.read_text().split())
    assert "harness.analysis.compare" in loaded  # (the list is of a run that compared)
    wrong = {m: why for m, why in NOT_ON_A_REPEAT.items() if m in loaded}
    assert wrong == {}
