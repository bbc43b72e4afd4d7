r"""Every generated sdkconfig.defaults, resolved by ESP-IDF's own kconfgen (esp-idf-kconfig, the `test`
extra) against the Kconfig files of each supported ESP-IDF release: every ESP-IDF symbol esp-check writes
must come out with the value it wrote (kconfgen drops silently what a symbol's dependencies hide, e.g. a
console baud without the custom console).

esp-idf-kconfig is not in the `test` extra: it brings textual and platformdirs, whose pytest11 plugin
would load into this suite (tests/test_conformance_isolation.py), for a test that needs trees from
outside the repository anyway. Install it where this test runs (`pip install esp-idf-kconfig`, or
`pip install --target DIR esp-idf-kconfig` and DIR on PYTHONPATH for this run).

Opt-in: the Kconfig trees stay out of the repository. ESP_CHECK_IDF_KCONFIG_DIR names a directory with one
ESP-IDF tree per release (only its Kconfig* and sdkconfig.rename* files are read), e.g. from a clone::

    pat='^(Kconfig|sdkconfig\.rename|components/.*/(Kconfig[^/]*|sdkconfig\.rename[^/]*))$'
    for t in v5.3 v5.3.5 v5.4 v5.4.4 v5.5 v5.5.3 v5.5.5; do mkdir -p trees/$t; git -C esp-idf archive $t \
      $(git -C esp-idf ls-tree -r --name-only $t | grep -E "$pat") | tar -x -C trees/$t; done

The rule it confirmed (the console baud needs CONFIG_ESP_CONSOLE_UART_CUSTOM) is checked without the
trees in tests/test_generate.py, through the allow-list's `requires`. Nothing is faked here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.firmware import generate as gen
from harness.firmware.boards import list_boards, load_board
from harness.resources import boards_dir

TREES = Path(os.environ.get("ESP_CHECK_IDF_KCONFIG_DIR", "/nonexistent"))
MODEL = Path(__file__).parent / "data" / "models" / "cnn_classifier_11.tflite"

pytestmark = [
    pytest.mark.skipif(
        not TREES.is_dir(), reason="ESP_CHECK_IDF_KCONFIG_DIR (ESP-IDF Kconfig trees) not set"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("kconfgen") is None,
        reason="esp-idf-kconfig not installed (pip install esp-idf-kconfig)",
    ),
]


def kconfgen(tree: Path, target: str, defaults: Path, work: Path) -> tuple[dict[str, object], str]:
    """The resolved configuration (config/sdkconfig.json) and kconfgen's notes, with the inputs ESP-IDF's
    tools/cmake/kconfig.cmake gives it: every component's Kconfig / Kconfig.projbuild / renames."""
    comps = sorted(p for p in (tree / "components").iterdir() if p.is_dir())
    kconfigs = [str(c / "Kconfig") for c in comps if (c / "Kconfig").is_file()]
    projbuild = [str(c / "Kconfig.projbuild") for c in comps if (c / "Kconfig.projbuild").is_file()]
    renames = [str(c / n) for c in comps for n in ("sdkconfig.rename", f"sdkconfig.rename.{target}")]
    work.mkdir(parents=True, exist_ok=True)
    (work / "kconfigs.in").write_text("".join(f'source "{k}"\n' for k in kconfigs))
    (work / "kconfigs_projbuild.in").write_text("".join(f'source "{k}"\n' for k in projbuild))
    env = {
        "COMPONENT_KCONFIGS": ";".join(kconfigs),
        "COMPONENT_KCONFIGS_PROJBUILD": ";".join(projbuild),
        "COMPONENT_SDKCONFIG_RENAMES": ";".join(r for r in renames if Path(r).is_file()),
        "IDF_TARGET": target,
        "IDF_TOOLCHAIN": "gcc",
        "IDF_VERSION": tree.name.lstrip("v"),
        "IDF_ENV_FPGA": "",
        "IDF_PATH": str(tree),
        "COMPONENT_KCONFIGS_SOURCE_FILE": str(work / "kconfigs.in"),
        "COMPONENT_KCONFIGS_PROJBUILD_SOURCE_FILE": str(work / "kconfigs_projbuild.in"),
    }
    (work / "config.env").write_text(json.dumps(env))
    argv = [sys.executable, "-m", "kconfgen", "--list-separator=semicolon",
            "--kconfig", str(tree / "Kconfig"), "--sdkconfig-rename", str(tree / "sdkconfig.rename"),
            "--config", str(work / "sdkconfig"),
            "--defaults", str(defaults), "--env", "IDF_MINIMAL_BUILD=n",
            "--env", f"IDF_INIT_VERSION={tree.name.lstrip('v')}", "--env-file", str(work / "config.env"),
            "--output", "json", str(work / "sdkconfig.json")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((work / "sdkconfig.json").read_text()), proc.stdout + proc.stderr


def _expected(value: str) -> object:
    if value == "y":
        return True
    if value == "n":
        return False
    if value.startswith('"'):
        return value.strip('"')
    return int(value, 0)


def _boards(tmp: Path) -> list[str]:
    """Every built-in board a real ESP-IDF builds, and one with a 921600 console (a user's board file)."""
    names = [b.name for b in list_boards() if b.builder in ("pio", "idf")]
    fast = tmp / "fast-console.toml"
    text = (boards_dir() / "esp32-devkitc.toml").read_text()
    fast.write_text(re.sub(r"(?m)^monitor_baud = \d+$", "monitor_baud = 921600", text)
                    .replace('name = "esp32-devkitc"', 'name = "fast-console"'))  # fmt: skip
    return [*names, str(fast)]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.lstrip("v").split("."))


def test_every_written_symbol_survives_kconfgen(tmp_path: Path) -> None:
    """A symbol an older release does not have is skipped there when the allow-list says that release
    behaves as if it had the value written (`idf_since` with `absent_means`)."""
    allow = gen.load_allowlist()["symbols"]
    trees = sorted(p for p in TREES.iterdir() if (p / "Kconfig").is_file())
    assert trees, f"no ESP-IDF tree (a directory with a Kconfig file) in {TREES}"
    for board_ref in _boards(tmp_path):
        board = load_board(board_ref)
        (p,) = gen.generate_projects(
            MODEL, [], board_ref, out_dir=tmp_path / board.name, variants=("ansi",),
            features=gen.FirmwareFeatures(embed_inputs=False),
        )  # fmt: skip
        defaults = p.path / "sdkconfig.defaults"
        written = {}
        for line in defaults.read_text().splitlines():
            m = re.match(r"^(?:# )?CONFIG_([A-Z0-9_]+)(?:=(.*)| is not set)$", line)
            if m and not m.group(1).startswith("NN_"):  # esp-nn's own Kconfig is not in the ESP-IDF tree
                written[m.group(1)] = "n" if m.group(2) is None else m.group(2)
        low = board.idf_range[0]
        for tree in trees:
            if tuple(int(x) for x in tree.name.lstrip("v").split(".")) < tuple(
                int(x) for x in low.split(".")
            ):
                continue  # the board needs a newer ESP-IDF than this tree (idf_min)
            resolved, notes = kconfgen(tree, board.chip, defaults, tmp_path / "w" / board.name / tree.name)
            where = f"{board.name} on ESP-IDF {tree.name}"
            hidden = [ln for ln in notes.splitlines() if "not visible" in ln]
            assert not hidden, f"{where}: kconfgen dropped " + "\n".join(hidden)
            for key, value in written.items():
                entry = allow[f"CONFIG_{key}"]
                if (
                    key not in resolved
                    and "idf_since" in entry
                    and _version(tree.name) < _version(entry["idf_since"])
                ):
                    assert entry.get("absent_means") == value, f"{where}: CONFIG_{key} is missing"
                    continue  # 5.4.4 has some of the 5.5.2 symbols: compared below when present
                got = resolved.get(key)
                got = int(got, 16) if isinstance(got, str) and got.startswith("0x") else got
                assert got == _expected(value), f"{where}: CONFIG_{key}={value} resolved to {got!r}"
