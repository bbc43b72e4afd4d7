"""Compile a generated project with ESP-IDF's own CMake build (by hand, not in CI).

Generates the projects of one model for one board (both variants), copies each into a scratch
directory with esp-nn and esp-tflite-micro as local components (the component manager cannot download
here), configures it with ESP-IDF's CMake (``cmake -G Ninja -DIDF_TARGET=<chip>``: kconfgen over the
real Kconfig tree with the project's ``sdkconfig.defaults``) and compiles the ``main`` component's
objects with ``ninja`` (``--components``: esp-nn's and esp-tflite-micro's too). Nothing is linked.
Prints kconfgen's notes on ``sdkconfig.defaults`` (unknown symbols: the build would ignore them), every
warning and error in the generated files, and the count of those in the components. Exit status: 0 clean
(or skipped), 1 a kconfgen note, a diagnostic in our files, a failed object or a failed configure.

Needs, else it says what is missing and exits 0 (skipped):

- ``ESP_CHECK_IDF_DIR``: an ESP-IDF tree (e.g. ``git archive v5.5.3``; submodules absent is fine when
  ``ESP_CHECK_IDF_STUBS`` supplies stand-ins for the components that need them).
- ``ESP_CHECK_COMPONENTS_DIR``: the esp-nn and esp-tflite-micro sources, laid out as for
  tests/test_hybrid_compile.py (``esp-nn-v1.1.2`` / ``esp-nn`` / ``espressif__esp-nn``, the same for
  esp-tflite-micro).
- The chip's compiler on PATH (``riscv32-esp-elf-gcc`` or ``xtensa-<chip>-elf-gcc``): Espressif's, or
  wrappers (docs/firmware.md "Compiled with ESP-IDF's CMake" says how it was done with Debian's
  riscv64-unknown-elf GCC).
- A Python with ``esp-idf-kconfig`` and ``pyparsing`` (``ESP_CHECK_IDF_PYTHON``, default this one).

Optional: ``ESP_CHECK_IDF_STUBS``, a directory of stand-in components passed as
``EXTRA_COMPONENT_DIRS`` (they override ESP-IDF's of the same name).

Run: ``python bench/idf_compile_check.py [--board esp32c3-devkitm-1] [--components] [--work DIR]``
(``--tap [--dump-ops 0,1]``, ``--streamed``, ``--ansi-ops 0,1`` for the other firmwares).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.firmware.boards import load_board
from harness.firmware.generate import FirmwareFeatures, generate_projects

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "data" / "models" / "cnn_classifier_11.tflite"
INPUT = ROOT / "tests" / "data" / "models" / "inputs" / "cnn_classifier_11.png"
DIAG = re.compile(r"^(?P<path>[^ :]+):(?P<line>\d+):(?P<col>\d+): (?P<kind>warning|error): (?P<msg>.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")
# esp-tflite-micro's CMakeLists.txt takes esp-nn from the component manager, which adds it from its
# idf_component.yml; without the manager the scratch copy names it itself
TFLM_REQ_LINE = "set(priv_req)\n"


def _find_component(root: Path, name: str, version: str) -> Path | None:
    for cand in (f"{name}-v{version}", f"{name}-{version}", name, f"espressif__{name}"):
        if (root / cand / "CMakeLists.txt").is_file():
            return root / cand
    return None


def _compiler(chip: str) -> str:
    return (
        "riscv32-esp-elf-gcc" if chip.startswith(("esp32c", "esp32h", "esp32p")) else f"xtensa-{chip}-elf-gcc"
    )


def _scratch_tflm(src: Path, work: Path) -> Path:
    dst = work / "espressif__esp-tflite-micro"
    if not dst.exists():
        shutil.copytree(src, dst, symlinks=True)
        cml = dst / "CMakeLists.txt"
        text = cml.read_text()
        if TFLM_REQ_LINE not in text:
            raise SystemExit(f"{cml}: no '{TFLM_REQ_LINE.strip()}' line to add esp-nn after; check by hand")
        cml.write_text(text.replace(TFLM_REQ_LINE, TFLM_REQ_LINE + "set(pub_req espressif__esp-nn)\n", 1))
    return dst


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    with log.open("w") as fh:
        return subprocess.run(
            cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False
        ).returncode


def _diagnostics(log: Path) -> list[tuple[str, str, str]]:
    out = []
    for raw in log.read_text(errors="replace").splitlines():
        m = DIAG.match(ANSI.sub("", raw))
        if m:
            out.append((m["path"], m["kind"], f"{m['path']}:{m['line']}:{m['col']}: {m['kind']}: {m['msg']}"))
    return out


def check_project(proj: Path, chip: str, args: argparse.Namespace, env: dict[str, str]) -> int:
    """Configure and compile one scratch project: the number of findings in our files (1 if a step failed)."""
    build = proj / "build"
    cmake = ["cmake", "-G", "Ninja", "-S", str(proj), "-B", str(build), f"-DIDF_TARGET={chip}"]
    cmake += [f"-DPYTHON={env['ESP_CHECK_IDF_PYTHON']}", "-DPYTHON_DEPS_CHECKED=1", "-Wno-dev"]
    cmake += ["-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY"]  # no libc to link a test program with
    if env.get("ESP_CHECK_IDF_STUBS"):
        cmake.append(f"-DEXTRA_COMPONENT_DIRS={env['ESP_CHECK_IDF_STUBS']}")
    if _run(cmake, proj, env, proj / "configure.log") != 0:
        print(f"  configure FAILED: see {proj / 'configure.log'}")
        return 1
    conf = (proj / "configure.log").read_text(errors="replace")
    notes = [
        ln for ln in conf.splitlines() if ln.startswith("warning: ")
    ]  # kconfgen's, on sdkconfig.defaults
    print(f"  configured; kconfgen notes (e.g. an unknown symbol, which the build ignores): {len(notes)}")
    for ln in notes:
        print(f"    {ln}")
    listed = subprocess.run(
        ["ninja", "-C", str(build), "-t", "targets", "all"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    dirs = ("main", "espressif__esp-nn", "espressif__esp-tflite-micro") if args.components else ("main",)
    objs = sorted({ln.split(":")[0] for ln in listed.splitlines() if ln.split(":")[0].endswith(".obj")})
    objs = [o for o in objs if o.split("/")[1:2] and o.split("/")[1] in dirs]
    rc = _run(
        ["ninja", "-C", str(build), f"-j{args.jobs}", "-k", "0", *objs], proj, env, proj / "compile.log"
    )
    log = (proj / "compile.log").read_text(errors="replace")
    failed = [ln for ln in log.splitlines() if ln.startswith("FAILED:")]
    ours = [d for d in _diagnostics(proj / "compile.log") if d[0].startswith(str(proj / "main"))]
    theirs = [d for d in _diagnostics(proj / "compile.log") if not d[0].startswith(str(proj / "main"))]
    print(f"  {len(objs)} objects, ninja exit {rc}, {len(failed)} failed")
    print(f"  in the generated files: {len(ours)} diagnostics; elsewhere: {len(theirs)}")
    for _path, _kind, text in sorted(set(ours)):
        print(f"    {text}")
    for ln in failed:
        print(f"    {ln}")
    return len(notes) + len(ours) + len(failed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--board", default="esp32c3-devkitm-1")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--input", type=Path, default=INPUT)
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--components", action="store_true", help="also compile esp-nn and esp-tflite-micro")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tap", action="store_true", help="the per-op checksum firmware (docs/tap.md)")
    ap.add_argument("--dump-ops", default="", help="with --tap: ops whose tensors are dumped, e.g. 0,1")
    ap.add_argument("--streamed", action="store_true", help="no compiled-in inputs, as the flows build it")
    ap.add_argument("--ansi-ops", default="", help="hybrid firmware: op indices on ANSI C kernels, e.g. 0,1")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    env.setdefault("ESP_CHECK_IDF_PYTHON", sys.executable)
    board = load_board(args.board)
    missing = [v for v in ("ESP_CHECK_IDF_DIR", "ESP_CHECK_COMPONENTS_DIR") if not env.get(v)]
    missing += [
        t for t in (_compiler(board.chip), "cmake", "ninja") if shutil.which(t, path=env.get("PATH")) is None
    ]
    if missing:
        print(f"skipped: {', '.join(missing)} not set / not on PATH (see this script's docstring)")
        return 0
    comp = Path(env["ESP_CHECK_COMPONENTS_DIR"])
    espnn, tflm = _find_component(comp, "esp-nn", "1.1.2"), _find_component(comp, "esp-tflite-micro", "1.3.8")
    if espnn is None or tflm is None:
        print(f"skipped: esp-nn / esp-tflite-micro not found under {comp}")
        return 0
    env.update(IDF_PATH=env["ESP_CHECK_IDF_DIR"], IDF_COMPONENT_MANAGER="0")
    with tempfile.TemporaryDirectory(prefix="idf-compile-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tflm_copy = _scratch_tflm(tflm, work)
        findings = 0
        ansi_ops, dump_ops = (
            tuple(int(i) for i in s.split(",") if i.strip()) for s in (args.ansi_ops, args.dump_ops)
        )
        features = FirmwareFeatures(
            tap=args.tap, dump_ops=dump_ops, embed_inputs=not args.streamed, ansi_ops=ansi_ops
        )
        inputs = [] if args.streamed else [args.input]
        variants = ("optimized",) if ansi_ops else ("optimized", "ansi")
        generated = generate_projects(
            args.model, inputs, board, out_dir=work / "generated", variants=variants, features=features
        )
        for gp in generated:
            proj = work / f"{board.chip}-{gp.variant}"
            shutil.rmtree(proj, ignore_errors=True)
            shutil.copytree(gp.path, proj)
            (proj / "components").mkdir(exist_ok=True)
            (proj / "components" / "espressif__esp-nn").symlink_to(espnn)
            (proj / "components" / "espressif__esp-tflite-micro").symlink_to(tflm_copy)
            print(f"{board.name} {gp.variant}: {proj}")
            findings += check_project(proj, board.chip, args, env)
    print("clean" if findings == 0 else f"{findings} finding(s) in the generated projects")
    return 0 if findings == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
