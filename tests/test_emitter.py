"""Contract tests: the firmware's C emitter (compiled with the host compiler), its Python twin, the parser.

Nothing is faked here: the C file is the one the generated firmware compiles, loaded through ctypes.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from c_protocol import emitter_sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import ModelError
from harness.protocol import emitter as em_mod
from harness.protocol.capture import parse_capture
from harness.protocol.emitter import (
    LINE_MAX,
    CEmitter,
    ProtocolOverflowError,
    PythonEmitter,
    RunSpec,
    TensorSpec,
    build_c_library,
    emit_capture,
    make_emitter,
    pack_info,
    sanitize_value,
)

HAVE_CC = em_mod.find_c_compiler() is not None
_skip_no_cc = pytest.mark.skipif(
    not HAVE_CC, reason="no host C compiler (cc/gcc/clang): C emitter contract not testable"
)


def needs_cc(f):  # type: ignore[no-untyped-def]
    """Marker ``needs_cc`` plus a skip with a reason when there is no host C compiler."""
    return pytest.mark.needs_cc(_skip_no_cc(f))


NP = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "float32": np.float32}
FULL_INFO = [
    ("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
    ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
    ("model_sha256", "3c" * 32), ("model_bytes", 28888), ("inputs", 1), ("outputs", 1),
]  # fmt: skip


@pytest.fixture(scope="module")
def libpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_CC:
        pytest.skip("no host C compiler")
    return build_c_library(tmp_path_factory.mktemp("emitter-cache"))


def run_both(libpath: Path, script) -> tuple[bytes, bytes]:  # type: ignore[no-untyped-def]
    outs: list[bytes] = []
    for em_factory in (lambda w: CEmitter(w, em_mod.load_c_library(libpath)), PythonEmitter):
        chunks: list[bytes] = []
        script(em_factory(chunks.append))
        outs.append(b"".join(chunks))
    return outs[0], outs[1]


def info_for(n_inputs: int, n_outputs: int) -> list[tuple[str, str | int]]:
    return [(k, n_inputs if k == "inputs" else n_outputs if k == "outputs" else v) for k, v in FULL_INFO]


@st.composite
def tensors(draw: st.DrawFn) -> TensorSpec:
    dtype = draw(st.sampled_from(list(NP)))
    ndims = draw(st.integers(0, 4))
    # sizes around the 96-byte chunk boundary, 0-sized dims, scalars
    dims = tuple(draw(st.lists(st.integers(0, 7), min_size=ndims, max_size=ndims)))
    if draw(st.booleans()) and ndims:
        dims = (*dims[:-1], draw(st.sampled_from([1, 23, 24, 25, 48, 95, 96, 97, 193])))
    count = int(np.prod(dims)) if dims else 1
    raw = draw(
        st.binary(
            min_size=count * np.dtype(NP[dtype]).itemsize, max_size=count * np.dtype(NP[dtype]).itemsize
        )
    )
    scale = draw(st.one_of(st.just(0.0), st.floats(0.0009765625, 16.0, width=32)))
    zp = draw(st.integers(-128, 127))
    name = draw(st.text(max_size=80))
    return TensorSpec(dtype, dims, scale, zp, raw, name)


@needs_cc
def test_c_source_is_portable_c99_and_warning_free(tmp_path: Path) -> None:
    cc = em_mod.find_c_compiler()
    src, hdr = emitter_sources()
    includes = {
        line.split()[1]
        for line in (src.read_text() + hdr.read_text()).splitlines()
        if line.startswith("#include")
    }
    assert includes == {
        '"esp_check_proto.h"',
        "<stddef.h>",
        "<stdint.h>",
        "<string.h>",
        "<stdio.h>",
        "<math.h>",
    }
    proc = subprocess.run(
        [cc, "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion", "-Wshadow", "-Werror", "-c",
         str(src), "-o", str(tmp_path / "x.o")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    nm = shutil.which("nm")
    if nm:  # no heap, no TFLM/IDF: the object needs only these C library symbols
        undefined = subprocess.run(
            [nm, "-u", str(tmp_path / "x.o")], capture_output=True, text=True, check=True
        )
        names = {ln.split()[-1].lstrip("_") for ln in undefined.stdout.splitlines() if ln.strip()}
        assert names <= {"memcpy", "memset", "strlen", "strcmp", "snprintf", "GLOBAL_OFFSET_TABLE_"}, names


@needs_cc
def test_c_and_python_identical_and_parse_back_simple(libpath: Path) -> None:
    data = bytes([130, 128, 163, 172, 128, 202, 152, 134, 148, 163, 130])
    spec = RunSpec(b"\x01\x02\x03", 48210, (TensorSpec("int8", (1, 11), 0.00390625, -128, data, "Identity"),))

    def script(e) -> None:  # type: ignore[no-untyped-def]
        emit_capture(e, info=FULL_INFO, runs=[spec], sim=True)

    c_out, py_out = run_both(libpath, script)
    assert c_out == py_out
    cap = parse_capture(c_out)
    assert cap.valid, cap.problems
    t = cap.runs[0].outputs[0]
    assert t.data.tobytes() == data and t.shape == (1, 11) and t.scale == 0.00390625 and t.zero_point == -128
    assert cap.runs[0].input_sha256 == hashlib.sha256(b"\x01\x02\x03").hexdigest()
    assert cap.runs[0].invoke_us == 48210 and cap.simulated and cap.nn_mode == "optimized"
    # human lines: exact dequantized values, %.6f (0.0078125 is a round-half-even tie: 0.007812)
    assert b"Output: 0.007812\r\n" in c_out and b"Output: 0.289062\r\n" in c_out
    assert all(len(line) + 1 <= LINE_MAX for line in c_out.split(b"\n"))


@needs_cc
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(runs=st.lists(st.lists(tensors(), min_size=1, max_size=3), min_size=1, max_size=2), data=st.data())
def test_contract_random_tensors(libpath: Path, runs: list[list[TensorSpec]], data: st.DataObject) -> None:
    n_out = len(runs[0])
    runs = [r[:n_out] + [runs[0][k] for k in range(len(r), n_out)] for r in runs]  # same output count per run
    specs = [
        RunSpec(data.draw(st.binary(max_size=40)), data.draw(st.integers(0, 2**40)), tuple(r)) for r in runs
    ]
    human_max = data.draw(st.integers(0, 20))

    def script(e) -> None:  # type: ignore[no-untyped-def]
        emit_capture(e, info=info_for(len(specs), n_out), runs=specs, human_max=human_max)

    c_out, py_out = run_both(libpath, script)
    assert c_out == py_out
    cap = parse_capture(c_out)
    assert cap.valid, cap.problems
    assert len(cap.runs) == len(specs)
    for run, spec in zip(cap.runs, specs, strict=True):
        assert run.input_sha256 == hashlib.sha256(spec.input_data).hexdigest()
        assert run.invoke_us == spec.invoke_us
        for got, want in zip(run.outputs, spec.outputs, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape and got.zero_point == want.zp
            assert got.scale == float(np.float32(want.scale))
            assert got.data.tobytes() == want.data
            expected_name = sanitize_value(want.name, 64).decode() if want.name.split("\0")[0] else ""
            assert got.name == ("" if expected_name == "-" else expected_name)
    n_lines = c_out.count(b"Output: ")
    assert n_lines == sum(min(human_max, len(t.data) // np.dtype(NP[t.dtype]).itemsize) for r in specs
                          for t in r.outputs)  # fmt: skip


@needs_cc
def test_float32_special_values_and_int_extremes(libpath: Path) -> None:
    f = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38, -1.5], dtype=np.float32)
    i32 = np.array([-(2**31), 2**31 - 1, 0], dtype=np.int32)
    i16 = np.array([-32768, 32767], dtype=np.int16)
    u8 = np.array([0, 255], dtype=np.uint8)

    def script(e) -> None:  # type: ignore[no-untyped-def]
        e.begin("x", False)
        for rec in pack_info(info_for(1, 4)):
            e.info(rec)
        e.input(0, 0, "0" * 64)
        e.time(0, -1)
        e.tensor(0, 0, "float32", [8], 0.0, 0, f.tobytes())
        e.tensor(0, 1, "int32", [3], 1e-3, -(2**31), i32.tobytes())
        e.tensor(0, 2, "int16", [2], 0.5, 7, i16.tobytes())
        e.tensor(0, 3, "uint8", [2], 0.0, 0, u8.tobytes())
        e.end(True)

    c_out, py_out = run_both(libpath, script)
    assert c_out == py_out
    big = b"Output: %.6f" % (4294967295 * float(np.float32(1e-3)))
    for line in (b"Output: nan", b"Output: inf", b"Output: -inf", b"Output: -0.000000", b"Output: -1.500000",
                 big, b"Output: 255.000000"):  # fmt: skip
        assert line + b"\r\n" in c_out, line
    cap = parse_capture(c_out)
    assert cap.valid, cap.problems
    got = cap.runs[0].outputs
    assert got[0].data.tobytes() == f.tobytes()  # NaN bits survive
    assert got[1].data.tolist() == i32.tolist() and got[2].data.tolist() == i16.tolist()


@needs_cc
def test_hostile_names_are_sanitized(libpath: Path) -> None:
    hostile = [
        "a b*c=d",
        "\x1b[31mred\x1b[0m",
        "ünï\u2603",
        "x" * 500,
        "@EC1 0 BEGIN",
        "\r\n*DEADBEEF",
        "a\0hidden",
    ]

    def script(e) -> None:  # type: ignore[no-untyped-def]
        e.begin("0.1.0 dirty*", False)
        e.info([("nn", "ansi c\n"), ("target", "")])
        for o, name in enumerate(hostile):
            e.tensor(0, o, "int8", [1], 1.0, 0, b"\x05", name=name)
        e.error("invoke", -3, "Invoke failed:\r\n*bad* " + "y" * 300, i=0)

    c_out, py_out = run_both(libpath, script)
    assert c_out == py_out
    lines = c_out.split(b"\r\n")
    assert all(len(x) + 2 <= LINE_MAX for x in lines)
    for line in lines:
        if line.startswith(b"@EC1"):
            body, _, crc = line.rpartition(b"*")
            assert f"{zlib.crc32(body):08X}".encode() == crc
            assert all(0x20 <= c <= 0x7E for c in line)
            assert line.count(b"@EC1 ") == 1 and line.count(b"*") == 1  # the marker includes its space
    assert b"fwver=0.1.0_dirty_" in c_out and b"nn=ansi_c_ " in c_out and b"target=- " in c_out
    assert b"name=a_b_c=d " in c_out and b"name=_[31mred_[0m " in c_out
    assert b"name=" + b"x" * 64 + b" " in c_out and b"name=a " in c_out  # truncated; C string ends at NUL
    assert b"msg=Invoke_failed:___bad__" + b"y" * (120 - 22) + b" " in c_out
    cap = parse_capture(c_out)  # no INPUT/END: invalid, but every record passed its CRC
    assert not any("corrupted" in p for p in cap.problems), cap.problems
    assert len(cap.records) + cap.payload_records == 2 + len(hostile) * 2 + 1  # DATA: counted, not kept


@needs_cc
def test_overflow_behaviour(libpath: Path) -> None:
    # Python API: an INFO that does not fit raises before anything is written, on both backends.
    for factory in (lambda w: CEmitter(w, em_mod.load_c_library(libpath)), PythonEmitter):
        out: list[bytes] = []
        e = factory(out.append)
        e.begin("v", False)
        with pytest.raises(ProtocolOverflowError):
            e.info([("k", "v" * 300)])
        with pytest.raises(ProtocolOverflowError):
            e.info([("Bad-Key", "v")])
        assert len(out) == 1
        # Tensors with too many dims become an ERROR record in both (what the firmware does)
        e.tensor(0, 0, "int8", [1] * 9, 1.0, 0, b"\x01")
        e.tensor(0, 0, "int8", [2, 2], 1.0, 0, b"\x01")  # size does not match the shape
        e.tensor(0, 0, "bfloat16", [1], 1.0, 0, b"\x01\x02")
        text = b"".join(out)
        assert b"ERROR stage=internal code=0 i=0 msg=bad_shape" in text
        assert b"ERROR stage=internal code=0 i=0 msg=tensor_size" in text
        assert b"ERROR stage=internal code=0 i=0 msg=bad_dtype" in text
    # C API directly (as the firmware calls it): an overflowing record becomes an ERROR with the same seq.
    lib = em_mod.load_c_library(libpath)
    got: list[bytes] = []
    cb = em_mod._WRITE_FN(lambda _c, buf, n: (got.append(ctypes.string_at(buf, n)), n)[1])
    state = ctypes.create_string_buffer(int(lib.ecp_sizeof()))
    lib.ecp_init(state, cb, None)
    lib.ecp_begin(state, b"v", 0)
    lib.ecp_record_start(state, b"INFO")
    for k in range(40):
        lib.ecp_kv_str(state, f"key{k}".encode(), b"value_value")
    assert lib.ecp_record_end(state) == -1
    assert lib.ecp_info_str(state, b"nn", b"optimized") == 0
    assert got[1].startswith(b"@EC1 1 ERROR stage=internal code=0 msg=record_overflow *")
    assert got[2].startswith(b"@EC1 2 INFO nn=optimized *")
    cap = parse_capture(b"".join(got))
    assert cap.errors and cap.errors[0].msg == "record_overflow"


def test_python_backend_without_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(em_mod, "find_c_compiler", lambda: None)
    out: list[bytes] = []
    e = make_emitter(out.append)
    assert e.backend == "python"
    e.begin("v", False)
    assert out == [b"@EC1 0 BEGIN proto=1 fw=esp-check fwver=v sim=0 *%08X\r\n" % zlib.crc32(
        b"@EC1 0 BEGIN proto=1 fw=esp-check fwver=v sim=0 ")]  # fmt: skip
    with pytest.raises(Exception, match="unknown emitter backend"):
        make_emitter(out.append, backend="rust")


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_header_is_usable_from_cpp_firmware(tmp_path: Path) -> None:
    """The firmware's app_main.cc includes the header: it must compile as C++ with C linkage."""
    src, _ = emitter_sources()
    main_cc = tmp_path / "main.cc"
    main_cc.write_text(
        '#include "esp_check_proto.h"\n'
        "static int w(void *, const char *, size_t n) { return static_cast<int>(n); }\n"
        'int main() { ecp_t e; ecp_init(&e, w, nullptr); ecp_begin(&e, "v", 0); return ecp_end(&e, 1); }\n'
    )
    obj = tmp_path / "proto.o"
    cc = em_mod.find_c_compiler() or "gcc"
    subprocess.run([cc, "-std=c99", "-c", str(src), "-o", str(obj)], check=True)
    exe = tmp_path / "a.out"
    proc = subprocess.run(
        ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(src.parent), str(main_cc), str(obj),
         "-o", str(exe)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert subprocess.run([str(exe)], check=False).returncode == 0


@needs_cc
def test_concurrent_boards_compile_the_library_once(tmp_path: Path) -> None:
    """Four simulated boards starting together ask for the library at once: one compiles, three wait.

    The compiler is the real one behind a wrapper that logs each call and is slow to start, so that
    unlocked callers would all find the library missing (the runner's cold start)."""
    cc = em_mod.find_c_compiler()
    assert cc is not None
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "slow-cc"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> "{log}"\nsleep 0.5\nexec "{cc}" "$@"\n')
    wrapper.chmod(0o755)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: build_c_library(tmp_path, compiler=str(wrapper)), range(4)))
    assert len(set(paths)) == 1 and paths[0].is_file()
    assert len(log.read_text().split()) == 1


@needs_cc
def test_library_cache_reuse_and_concurrent_builds(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: build_c_library(tmp_path), range(4)))
    assert len(set(paths)) == 1 and paths[0].is_file()
    assert [p.name for p in (tmp_path / "emitter").iterdir()] == [paths[0].name]  # no temp files left
    mtime = paths[0].stat().st_mtime_ns
    assert build_c_library(tmp_path) == paths[0] and paths[0].stat().st_mtime_ns == mtime  # cache hit
    out: list[bytes] = []
    e = make_emitter(out.append, backend="c", cache_dir=tmp_path)
    assert e.backend == "c"


@needs_cc
def test_sources_found_in_wheel_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed wheel has no repo root: templates live in harness/_data/firmware_templates."""
    import harness.resources as res

    pkg = tmp_path / "site" / "harness"
    (pkg / "_data").mkdir(parents=True)
    shutil.copytree(emitter_sources()[0].parent.parent, pkg / "_data" / "firmware_templates")
    monkeypatch.setattr(res, "_PACKAGE_DIR", pkg)
    src, hdr = emitter_sources()
    assert src == pkg / "_data" / "firmware_templates" / "common" / "esp_check_proto.c" and hdr.is_file()
    assert build_c_library(tmp_path / "cache").is_file()


def test_compile_error_is_a_clear_build_error(tmp_path: Path) -> None:
    fake_cc = tmp_path / "fakecc"
    fake_cc.write_text("#!/bin/sh\necho 'fakecc: error: nope' >&2\nexit 1\n")
    fake_cc.chmod(0o755)
    if sys.platform == "win32":
        pytest.skip("shell script stand-in")
    from harness.errors import BuildError

    with pytest.raises(BuildError, match="fakecc: error: nope"):
        build_c_library(tmp_path, compiler=str(fake_cc))
    assert not list((tmp_path / "emitter").glob(".build-*"))


def test_the_c_header_bounds_are_the_python_sides() -> None:
    """esp_check_proto.h's ``ECP_*`` numbers and harness.protocol.spec's are one fact in two languages:
    every ``#define ECP_`` of the header has its Python constant (a bound added or changed on one side
    alone fails here), the protocol version too; and the model loader refuses the ranks the firmware
    cannot emit by the same bound (not a copy of it)."""
    from harness.model import loader
    from harness.protocol import spec

    header = emitter_sources()[1].read_text(encoding="utf-8")
    c_side = dict(re.findall(r"#define ECP_(\w+)[ \t]+(\S+)", header))
    py_side = {
        "PROTO_VERSION": spec.PROTO_VERSION,
        "LINE_MAX": spec.LINE_MAX,
        "DATA_CHUNK": spec.DATA_CHUNK,
        "NAME_MAX": spec.NAME_MAX,
        "MSG_MAX": spec.MSG_MAX,
        "MAX_DIMS": spec.MAX_DIMS,
        "TAP_MAX_TENSORS": spec.TAP_MAX_TENSORS,
        "OPNAME_MAX": spec.OPNAME_MAX,
        "PRINTABLE_MIN": spec.PRINTABLE[0],
        "PRINTABLE_MAX": spec.PRINTABLE[-1],
    }
    assert {k: int(v, 0) for k, v in c_side.items()} == {k: int(v) for k, v in py_side.items()}
    assert em_mod.MAX_DIMS is spec.MAX_DIMS and not hasattr(loader, "MAX_RANK")
    loader._check_shape(0, "t", (1,) * spec.MAX_DIMS, "int8", False)
    with pytest.raises(ModelError, match="TFLM cannot hold"):
        loader._check_shape(0, "t", (1,) * (spec.MAX_DIMS + 1), "int8", False)


@needs_cc
def test_the_record_marker_is_built_from_the_protocol_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``@EC1 `` is the protocol version (docs/protocol.md): each side builds it from its version constant,
    never a copy. The Python side: spec.MARKER, the only spelling in harness/. The C side: a scratch copy of
    the firmware templates whose header says version 7 marks its records ``@EC7 ``."""
    from harness.protocol import spec
    from harness.resources import templates_dir

    assert f"@EC{spec.PROTO_VERSION} ".encode() == spec.MARKER
    harness_dir = Path(em_mod.__file__).parents[1]
    spelled = [
        p.name for p in harness_dir.rglob("*.py") if re.search(r"@EC\d", p.read_text(encoding="utf-8"))
    ]
    assert spelled == []
    pkg = tmp_path / "site" / "harness"
    shutil.copytree(templates_dir(), pkg / "_data" / "firmware_templates")
    header = pkg / "_data" / "firmware_templates" / "common" / "esp_check_proto.h"
    text = header.read_text(encoding="utf-8")
    assert f"#define ECP_PROTO_VERSION {spec.PROTO_VERSION}\n" in text
    header.write_text(text.replace("#define ECP_PROTO_VERSION 1\n", "#define ECP_PROTO_VERSION 7\n"))
    monkeypatch.setattr("harness.resources._PACKAGE_DIR", pkg)
    out: list[bytes] = []
    e = CEmitter(out.append, em_mod.load_c_library(build_c_library(tmp_path / "cache")))
    e.begin("v", False)
    e.lib.ecp_record_start(e.state, b"INFO")
    e.lib.ecp_kv_str(e.state, b"nn", b"x" * 300)  # too long: the overflow ERROR record, marked the same way
    e.lib.ecp_record_end(e.state)
    assert out[0].startswith(b"@EC7 0 BEGIN proto=7 ") and out[1].startswith(b"@EC7 1 ERROR ")
