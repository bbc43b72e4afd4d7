"""Helpers for the native-target tests: the stand-in component tree, its model, faults, a local mirror.

The component tree (tests/data/native_components, a labelled TEST FIXTURE) has the layout and entry
points of esp-tflite-micro and esp-nn with trivial kernels (MAX_POOL_2D through esp-nn, RESHAPE, SOFTMAX), so
the native driver compiles and runs the real generated firmware against it in CI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import flatbuffers
import numpy as np
import tflite
from test_model_builder import Op, T, build_model

COMPONENTS = Path(__file__).parent / "data" / "native_components"
MAX_POOL_2D, RESHAPE, SOFTMAX = 17, 22, 25
FAULT_MARK = "out[c] = (int8_t)v; /* FIXTURE-FAULT */"
OPT_KERNEL = Path("esp-nn") / "src" / "pooling" / "esp_nn_max_pool_opt.c"
# The ANSI C kernel's store, where a one-sided fault goes into the ANSI side instead (the same FAULTS
# text works there: it writes ``out[c]`` from ``v``).
ANSI_KERNEL = Path("esp-nn") / "src" / "pooling" / "esp_nn_max_pool_ansi.c"
ANSI_MARK = "output[(oy * output_wd + ox) * channels + c] = (int8_t)best;"

# What the tests inject into the fixture's optimized max-pool kernel (replacing the FIXTURE-FAULT line).
FAULTS = {
    # +1 LSB on every element below 127: optimized != ANSI C and != host
    "off_by_one": "out[c] = (int8_t)(v == 127 ? v : v + 1);",
    # a scratch buffer one element too small (AddressSanitizer: heap-buffer-overflow)
    "scratch_overrun": (
        "{ int8_t *scratch = (int8_t *)malloc(channels);"
        " for (int k = 0; k <= channels; ++k) scratch[k] = (int8_t)v;"
        " out[c] = scratch[0]; free(scratch); }"
    ),
    # signed overflow (UndefinedBehaviorSanitizer); the value is still right
    "signed_overflow": (
        "{ volatile int32_t big = 2147483647; out[c] = (int8_t)(v + (big + channels) - big - channels); }"
    ),
    # 64 bytes written past the end of the output after its last element: no sanitizer, glibc aborts
    # (SIGABRT) when the driver frees its buffers, after the case's result was printed
    "heap_smash": (
        "out[c] = (int8_t)v;"
        " if (oy == output_ht - 1 && ox == output_wd - 1 && c == channels - 1) memset(out + c + 1, 0x7f, 64);"
    ),
    # a plain crash (no sanitizer needed): the program dies with SIGSEGV
    "segfault": "{ volatile int8_t *nowhere = (volatile int8_t *)0; *nowhere = (int8_t)v; }",
}


def _pool_2x2_valid(b: flatbuffers.Builder) -> int:
    tflite.Pool2DOptionsStart(b)
    tflite.Pool2DOptionsAddPadding(b, tflite.Padding.VALID)
    tflite.Pool2DOptionsAddStrideW(b, 2)
    tflite.Pool2DOptionsAddStrideH(b, 2)
    tflite.Pool2DOptionsAddFilterWidth(b, 2)
    tflite.Pool2DOptionsAddFilterHeight(b, 2)
    tflite.Pool2DOptionsAddFusedActivationFunction(b, 0)
    return int(tflite.Pool2DOptionsEnd(b))


def _reshape_1x48(b: flatbuffers.Builder) -> int:
    tflite.ReshapeOptionsStartNewShapeVector(b, 2)
    for v in (48, 1):
        b.PrependInt32(v)
    shape = b.EndVector()
    tflite.ReshapeOptionsStart(b)
    tflite.ReshapeOptionsAddNewShape(b, shape)
    return int(tflite.ReshapeOptionsEnd(b))


def write_model(path: Path) -> Path:
    """input [1,8,8,3] -> MAX_POOL_2D 2x2/2 VALID -> [1,4,4,3] -> RESHAPE -> output [1,48] (int8)."""
    q = {"scale": 0.05, "zero_point": -3}
    data = build_model(
        [
            T("input", (1, 8, 8, 3), "int8", **q),
            T("pooled", (1, 4, 4, 3), "int8", **q),
            T("shape", (2,), "int32", data=np.array([1, 48], dtype=np.int32)),
            T("output", (1, 48), "int8", **q),
        ],
        [
            Op(MAX_POOL_2D, [0], [1], options=(tflite.BuiltinOptions.Pool2DOptions, _pool_2x2_valid)),
            Op(RESHAPE, [1, 2], [3], options=(tflite.BuiltinOptions.ReshapeOptions, _reshape_1x48)),
        ],
        inputs=[0],
        outputs=[3],
    )
    path.write_bytes(data)
    return path


def write_input(path: Path, seed: int = 7) -> Path:
    """An int8 input (taken as already quantized) for :func:`write_model`."""
    rng = np.random.default_rng(seed)
    np.save(path, rng.integers(-128, 128, size=(1, 8, 8, 3)).astype(np.int8))
    return path


REFUSED_DEPTH = 1024  # a softmax row this long, near its maximum, makes TFLM's reference abort


def _pool_2x2_valid_stride_2(b: flatbuffers.Builder) -> int:
    return _pool_2x2_valid(b)


def _reshape_row(b: flatbuffers.Builder) -> int:
    tflite.ReshapeOptionsStartNewShapeVector(b, 2)
    for v in (REFUSED_DEPTH, 1):
        b.PrependInt32(v)
    shape = b.EndVector()
    tflite.ReshapeOptionsStart(b)
    tflite.ReshapeOptionsAddNewShape(b, shape)
    return int(tflite.ReshapeOptionsEnd(b))


def _softmax_beta_1(b: flatbuffers.Builder) -> int:
    tflite.SoftmaxOptionsStart(b)
    tflite.SoftmaxOptionsAddBeta(b, 1.0)
    return int(tflite.SoftmaxOptionsEnd(b))


def write_refused_model(path: Path) -> Path:
    """A model TFLM's reference refuses on near-flat inputs, while the fixture's kernels run it.

    input [1,2,2*D,1] -> MAX_POOL_2D 2x2/2 VALID -> pooled [1,1,D,1] (output 0, through esp-nn, where
    faults are injected) -> RESHAPE [1,D] -> SOFTMAX -> probs (output 1), D = 1024. A softmax row of 512
    or more entries near its maximum fails the reference kernel's ``exponent <= 31`` check (SIGABRT).
    """
    q = {"scale": 0.05, "zero_point": 0}
    data = build_model(
        [
            T("input", (1, 2, 2 * REFUSED_DEPTH, 1), "int8", **q),
            T("pooled", (1, 1, REFUSED_DEPTH, 1), "int8", **q),
            T("shape", (2,), "int32", data=np.array([1, REFUSED_DEPTH], dtype=np.int32)),
            T("row", (1, REFUSED_DEPTH), "int8", **q),
            T("probs", (1, REFUSED_DEPTH), "int8", scale=1.0 / 256, zero_point=-128),
        ],
        [
            Op(
                MAX_POOL_2D, [0], [1], options=(tflite.BuiltinOptions.Pool2DOptions, _pool_2x2_valid_stride_2)
            ),
            Op(RESHAPE, [1, 2], [3], options=(tflite.BuiltinOptions.ReshapeOptions, _reshape_row)),
            Op(SOFTMAX, [3], [4], options=(tflite.BuiltinOptions.SoftmaxOptions, _softmax_beta_1)),
        ],
        inputs=[0],
        outputs=[1, 4],
    )
    path.write_bytes(data)
    return path


def write_refused_input(path: Path, seed: int = 3) -> Path:
    """Near-flat int8 values (99..101) for :func:`write_refused_model`: the reference refuses them."""
    rng = np.random.default_rng(seed)
    np.save(path, rng.integers(99, 102, size=(1, 2, 2 * REFUSED_DEPTH, 1)).astype(np.int8))
    return path


def faulty_components(dest: Path, fault: str, side: str = "optimized") -> Path:
    """A copy of the fixture tree with ``fault`` (a key of FAULTS) injected into one kernel only:
    the optimized one (``side="optimized"``) or the ANSI C one (``side="ansi_c"``)."""
    shutil.copytree(COMPONENTS, dest)
    return inject(dest, fault, side)


def inject(tree: Path, fault: str, side: str = "optimized") -> Path:
    """Inject ``fault`` into one kernel of the fixture tree copy ``tree`` (each side once at most)."""
    src = tree / (OPT_KERNEL if side == "optimized" else ANSI_KERNEL)
    text = src.read_text(encoding="utf-8")
    if side == "optimized":
        assert FAULT_MARK in text, "the fixture's fault marker moved"
        text = text.replace(FAULT_MARK, FAULTS[fault] + " /* injected by the test */")
    else:
        assert ANSI_MARK in text, "the fixture's ANSI C store moved"
        inject = FAULTS[fault].replace("out[c]", "output[(oy * output_wd + ox) * channels + c]")
        text = text.replace(ANSI_MARK, "{ int32_t v = best; " + inject + " } /* injected by the test */")
    src.write_text("#include <stdlib.h>\n#include <string.h>\n" + text, encoding="utf-8")
    return tree


def make_mirror(dest: Path, tmp: Path) -> Path:
    """A local component mirror of the fixture tree, as ``compote registry sync`` lays one out.

    The archives are packed by the component manager itself (``compote component pack``); the
    storage index (``components/<ns>/<name>.json``), the component hashes and ``checksums.json``
    come from the component manager's own functions (``CHECKSUMS.json``).
    """
    from idf_component_tools.hash_tools.calculate import hash_dir
    from idf_component_tools.hash_tools.checksums import ChecksumsManager
    from idf_component_tools.hash_tools.constants import CHECKSUMS_FILENAME

    deps = {
        "esp-nn": [{"name": "idf", "source": "idf", "spec": ">=4.2"}],
        "esp-tflite-micro": [
            {"name": "idf", "source": "idf", "spec": ">=5.0"},
            {
                "name": "esp-nn",
                "namespace": "espressif",
                "source": "service",
                "spec": ">=0.0.1",
                "require": True,
            },
        ],
    }
    for name, dependencies in deps.items():
        work = tmp / f"pack-{name}"
        shutil.copytree(COMPONENTS / name, work)
        dist = tmp / f"dist-{name}"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "idf_component_manager",
                "component",
                "pack",
                "--name",
                name,
                "--dest-dir",
                str(dist),
            ],
            cwd=work,
            check=True,
            capture_output=True,
        )
        version = "0.0.1"
        unpacked = dist / f"{name}_{version}"
        where = dest / "espressif" / name / version
        where.mkdir(parents=True)
        shutil.copy2(dist / f"{name}_{version}.tgz", where / f"{name}_{version}.tgz")
        ChecksumsManager(unpacked).dump(where)
        index = {
            "name": name,
            "namespace": "espressif",
            "versions": [
                {
                    "version": version,
                    "url": f"espressif/{name}/{version}/{name}_{version}.tgz",
                    "checksums": f"espressif/{name}/{version}/{CHECKSUMS_FILENAME}",
                    "component_hash": hash_dir(unpacked),
                    "dependencies": dependencies,
                    "docs": {},
                    "license": None,
                    "examples": [],
                    "targets": None,
                }
            ],
        }
        (dest / "components" / "espressif").mkdir(parents=True, exist_ok=True)
        (dest / "components" / "espressif" / f"{name}.json").write_text(json.dumps(index), encoding="utf-8")
    return dest
