"""Build the kernel-sweep driver (docs/sweep.md) for the host: esp-nn + TFLM reference kernels.

The driver (``firmware_templates/sweep/``) is a main component for :func:`build_program`, over one
library tree that holds esp-nn alone; what it compiles and from which sources is docs/sweep.md. A tree
without TFLM's reference kernel files gives a driver that reports the reference as not compiled in (the
CI fixture).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.sweep_cases import LAYOUT, OPS
from harness.errors import BuildError, UsageError
from harness.firmware.native.components import (
    ComponentSource,
    copy_once,
    find_components,
    snapshot,
    tree_sha256,
)
from harness.firmware.native.config import resolve
from harness.firmware.native.driver import NativePlan, NativeProgram, build_program, tree_key
from harness.firmware.native.toolchain import find_toolchain
from harness.firmware.toolrun import OutputCallback
from harness.resources import templates_dir, write_if_changed

SWEEP_IDF_VERSION = "5.5.3"  # the API level the stand-ins present; no ESP-IDF code is compiled
ESPNN = "espressif__esp-nn"
TFLM = "espressif__esp-tflite-micro"


@dataclass(frozen=True)
class SweepSources:
    """Where the kernels under test (esp-nn) and the reference kernels (esp-tflite-micro) come from."""

    espnn: ComponentSource
    tflm: ComponentSource | None

    def describe(self) -> dict[str, object]:
        return {
            "esp-nn": self.espnn.describe(),
            "esp-tflite-micro": self.tflm.describe() if self.tflm else None,
        }


def has_reference(tflm: ComponentSource | None) -> bool:
    """True when ``tflm`` holds the reference integer kernels the driver compiles."""
    return tflm is not None and (tflm.path / "tensorflow/lite/kernels/internal/common.cc").is_file()


_GROUPS_CHECK = re.compile(r"MatchingDim\(\s*input_shape\s*,\s*3\s*,\s*filter_shape\s*,\s*3\s*\)")
CONV_GLUE = Path("tensorflow/lite/micro/kernels/esp_nn/conv.cc")


def grouped_conv_refusal(tflm: ComponentSource | None) -> str:
    """Why a grouped conv does not reach esp-nn through ``tflm``'s conv glue ("" when it does): read from
    the sources given, not assumed (the ``MatchingDim`` check, docs/sweep.md "grouped convolutions")."""
    if tflm is None:
        return "no esp-tflite-micro sources were given: whether its conv glue passes groups on is unknown"
    glue = tflm.path / CONV_GLUE
    version = f"esp-tflite-micro {tflm.version or '(version not stated)'}"
    if not glue.is_file():
        return f"{version} has no {CONV_GLUE}: whether a grouped conv reaches esp-nn is unknown"
    if _GROUPS_CHECK.search(glue.read_text(encoding="utf-8", errors="replace")):
        return (
            f"{version}'s {CONV_GLUE} aborts on a grouped conv (MatchingDim(input_shape, 3, filter_shape, 3) "
            "fails when the input channels differ from the filter's): reached only through esp-nn's API, "
            "or through glue versions without that check"
        )
    return ""


def find_sweep_sources(
    components_dir: Path | None, espnn_dir: Path | None = None, tflm_dir: Path | None = None
) -> tuple[ComponentSource, ComponentSource | None]:
    """esp-nn (required) and esp-tflite-micro (optional: the reference) from the directories given.

    ``espnn_dir`` / ``tflm_dir`` are component directories themselves and win over ``components_dir``."""
    espnn = tflm = None
    if espnn_dir is not None:
        espnn = find_components(Path(espnn_dir).parent, [Path(espnn_dir).name])[0]
        espnn = ComponentSource(ESPNN, espnn.path, espnn.version, "components-dir")
    if tflm_dir is not None:
        found = find_components(Path(tflm_dir).parent, [Path(tflm_dir).name])[0]
        tflm = ComponentSource(TFLM, found.path, found.version, "components-dir")
    if components_dir is not None:
        if espnn is None:
            espnn = find_components(components_dir, [ESPNN])[0]
        if tflm is None:
            try:
                tflm = find_components(components_dir, [TFLM])[0]
            except UsageError:  # no esp-tflite-micro there: the sweep runs without the reference
                if not Path(components_dir).expanduser().is_dir():
                    raise
    if espnn is None:
        raise BuildError(
            "the sweep needs esp-nn sources: none were given",
            hint="pass --components-dir DIR (holding esp-nn and esp-tflite-micro) or --espnn DIR, or set "
            "ESP_CHECK_COMPONENTS_DIR",
        )
    return espnn, tflm


def layout_header() -> str:
    """sweep_layout.h: the driver's op codes (``OP_CONV``) and each param's index (``CONV_IH``, ...,
    ``CONV_N`` the count) from sweep_cases.OPS and LAYOUT. The two pools share the driver's code and one
    POOL_* line: layouts that differed would declare POOL_* twice, and the driver would not compile."""
    lines = [f"enum {{ {', '.join(f'OP_{op.upper()} = {code}' for op, code in OPS.items())} }};"]
    for op, names in LAYOUT.items():
        prefix = "POOL" if op.endswith("_pool") else op.upper()
        lines.append(f"enum {{ {', '.join(f'{prefix}_{n.upper()}' for n in (*names, 'n'))} }};")
    return "/* written by esp-check (sweep_build.py) */\n" + "\n".join(dict.fromkeys(lines)) + "\n"


def _main_dir(root: Path, tflm: ComponentSource | None) -> Path:
    """The driver's main component, made once per driver source + layout + reference tree."""
    src = templates_dir() / "sweep"
    tflm_path = str(tflm.path) if has_reference(tflm) and tflm is not None else ""
    layout = layout_header()
    digest = hashlib.sha256(f"{tree_sha256(src)}\0{layout}\0{tflm_path}".encode()).hexdigest()
    main = copy_once(src, root / "sweep-main" / digest[:20])
    header = "# written by esp-check (harness/firmware/native/sweep_build.py)\n"
    write_if_changed(main / "sweep_paths.cmake", f'{header}set(ESP_CHECK_SWEEP_TFLM "{tflm_path}")\n')
    write_if_changed(main / "sweep_layout.h", layout)
    return main


def build_sweep_driver(
    espnn: ComponentSource,
    tflm: ComponentSource | None,
    *,
    sanitize: bool,
    root: Path,
    out: Path,
    log_path: Path,
    bits: int = 64,
    jobs: int | None = None,
    on_output: OutputCallback | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[NativeProgram, SweepSources]:
    """Snapshot the sources and build the driver into ``out`` (BuildError, exit 3, when it fails)."""
    toolchain = find_toolchain(bits, sanitize, env)
    snap = snapshot([espnn] + ([tflm] if tflm is not None else []), root)
    espnn_s = snap[0]
    tflm_s = snap[1] if tflm is not None else None
    config = resolve({"CONFIG_IDF_TARGET": '"esp32"', "CONFIG_NN_OPTIMIZED": "y"})
    key = tree_key([espnn_s], config, SWEEP_IDF_VERSION, toolchain)
    main = _main_dir(root, tflm_s)
    plan = NativePlan(main, (espnn_s,), config, toolchain, idf_version=SWEEP_IDF_VERSION, root=root, key=key)
    program = build_program(plan, out, log_path=log_path, on_output=on_output, jobs=jobs, env=env)
    return program, SweepSources(espnn_s, tflm_s)
