"""A generated project on the native target: which sources, configuration and toolchain build it.

:func:`plan_native_build` turns a generated project (its ``esp-check.json``, ``sdkconfig.defaults``
and ``main/``) plus :class:`NativeOptions` into a :class:`NativePlan` whose ``key`` identifies the
compiled libraries; ``harness.firmware.build`` keys its build cache on it and runs
:func:`harness.firmware.native.driver.build_program` on a miss.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import BuildError
from harness.firmware.native.components import (
    FIRMWARE_COMPONENTS,
    download_components,
    find_components,
    snapshot,
)
from harness.firmware.native.config import parse_defaults, resolve
from harness.firmware.native.driver import NativePlan, tree_key
from harness.firmware.native.toolchain import find_toolchain
from harness.firmware.toolrun import OutputCallback, run_streaming

# What a native result means, for reports and the CLI (docs/native.md).
NATIVE_MEANING = (
    "NATIVE: the generated firmware compiled for this PC and run as a program: real esp-tflite-micro "
    "glue and ESP-NN's generic C kernels (what ESP32, C3 and C6 run); ESP-IDF replaced by stand-ins; "
    "the ESP32-S3/P4 assembly kernels were not run and no chip was involved"
)


@dataclass(frozen=True)
class NativeOptions:
    """How to build for the native target (``--components-dir``, ``--sanitize``, ``--jobs``)."""

    components_dir: Path | None = None  # local checkouts / managed_components; None: component manager
    sanitize: bool = False  # AddressSanitizer + UndefinedBehaviorSanitizer
    jobs: int | None = None  # parallel compile jobs (default: CPU count)


def plan_native_build(
    project: Path,
    manifest: Mapping[str, Any],
    options: NativeOptions,
    *,
    root: Path,
    log_path: Path,
    on_output: OutputCallback | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> NativePlan:
    """Find the toolchain and the component sources (downloading them if needed) for ``project``."""
    board_def = manifest.get("board_def") or {}
    bits = int((board_def.get("native") or {}).get("bits", 64))
    run_env = dict(os.environ if env is None else env)
    toolchain = find_toolchain(bits, options.sanitize, run_env)
    versions = manifest.get("versions") or {}
    idf_version = str(versions.get("esp-idf") or "5.5.3")
    try:
        defaults = (project / "sdkconfig.defaults").read_text(encoding="utf-8")
    except OSError as exc:
        raise BuildError(
            f"cannot read {project / 'sdkconfig.defaults'}: {exc}", hint="regenerate the project"
        ) from exc
    config = resolve(parse_defaults(defaults))
    if options.components_dir is not None:
        found = find_components(options.components_dir)
    else:

        def run(argv: list[str], cwd: Path, cm_env: Mapping[str, str]) -> tuple[int, list[str]]:
            return run_streaming(
                argv, cwd=cwd, env=cm_env, log_path=log_path, on_output=on_output, timeout=timeout
            )

        found = download_components(
            project / "main" / "idf_component.yml",
            root,
            idf_version=idf_version,
            target=str(manifest.get("chip") or board_def.get("chip") or "esp32"),
            run=run,
            env=run_env,
        )
    components = tuple(snapshot(found, root))
    warnings = []
    for comp in components:
        pinned = versions.get(FIRMWARE_COMPONENTS.get(comp.name, ""))
        if pinned and comp.version != pinned:
            warnings.append(
                f"{comp.name}: building version {comp.version or '(not stated)'} from {comp.origin}, "
                f"the project pins {pinned} (the firmware reports the version it was built with)"
            )
    with log_path.open("a", encoding="utf-8") as log:
        for comp in components:
            version = comp.version or "(no version)"
            log.write(f"native: {comp.name} {version} ({comp.origin}, sha256 {comp.sha256[:16]})\n")
        for w in warnings:
            log.write(f"native: warning: {w}\n")
    key = tree_key(components, config, idf_version, toolchain)
    return NativePlan(
        project / "main",
        components,
        config,
        toolchain=toolchain,
        idf_version=idf_version,
        root=root,
        key=key,
        warnings=tuple(warnings),
        dependencies_lock=next((c.lock for c in components if c.lock is not None), None),
    )
