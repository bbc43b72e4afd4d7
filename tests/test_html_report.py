"""``--html`` and ``--bundle`` on the simulated board, and the HTML rendered by a real headless browser.

Real: the whole flash-and-compare --tap flow on the simulated board (see tests/test_tap_flow.py for
what is faked), the HTML file, Pillow's PNGs, and Debian's chromium rendering it (skipped with a reason
when chromium is not installed: ``apt-get install -y chromium``).
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts

pytest.importorskip("tflite_micro")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
MODEL = "unet_mbv2_035_48.tflite"
INPUT = "inputs/unet_mbv2_035_48.png"


@pytest.fixture(scope="module")
def tapped_run(models_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("html")
    result = flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        port="sim://?fault=op_corrupt&fault_op=60&fault_region=last_row&variant_fault=optimized",
        out_dir=out / "out",
        options=JobOptions(
            cache_dir=out / "cache",
            timeouts=StageTimeouts(capture_total=60, capture_silence=5),
            tap=True,
            html=out / "report.html",
            bundle=out / "bundle.zip",
        ),
    )
    return result, out


@pytest.mark.slow
def test_html_is_self_contained_and_has_every_section(tapped_run) -> None:  # type: ignore[no-untyped-def]
    result, out = tapped_run
    text = (out / "report.html").read_text(encoding="utf-8")
    assert result.verdict == "mismatch" and "MISMATCH" in text and "SIMULATED BOARD" in text
    # self-contained: no scripts, no external references of any kind
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", text)
    for section in (
        "Per-output comparison",
        "Per-op checksums (--tap)",
        "Per-op timing",
        "Outputs as images",
    ):
        assert section in text
    assert "first divergent op 60 (RESIZE_NEAREST_NEIGHBOR)" in text
    assert text.count("<svg") >= 2  # checksum timeline and timing bars
    # the images are real PNGs: reference, optimized and difference of the 48x48 mask
    pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(pngs) >= 6
    sizes = {Image.open(io.BytesIO(base64.b64decode(p))).size for p in pngs}
    assert (48, 48) in sizes
    # the timeline marks op 60 as the first divergent op (dark red cell with its title)
    assert re.search(r'fill="#7f0000"><title>op 60: differs</title>', text)


@pytest.mark.slow
def test_bundle_has_what_a_bug_report_needs(tapped_run, models_dir: Path) -> None:  # type: ignore[no-untyped-def]
    _, out = tapped_run
    with zipfile.ZipFile(out / "bundle.zip") as z:
        names = set(z.namelist())
        assert f"model/{MODEL}" in names and "inputs/0/unet_mbv2_035_48.png" in names
        assert z.read(f"model/{MODEL}") == (models_dir / MODEL).read_bytes()
        for v in ("optimized", "ansi"):
            assert f"projects/{v}/sdkconfig.defaults" in names
            assert f"projects/{v}/main/idf_component.yml" in names
            assert f"projects/{v}/esp-check.json" in names
            assert f"logs/serial-{v}.log" in names and "logs/flash.log" in names  # one flash for both
            assert f"logs/tap-dump/serial-{v}.log" in names
        comp = z.read("projects/optimized/main/idf_component.yml").decode()
        assert "esp-nn" in comp or "esp-tflite-micro" in comp  # pinned component versions
        chip = json.loads(z.read("chip.json"))
        assert chip["optimized"]["chip"].upper().startswith("ESP32")
        report = json.loads(z.read("report.json"))
        assert report["tap"]["culprit"]["op"] == 60
        assert "report.html" in names and "README.txt" in names
        assert not any("/.pio/" in n or "/build/" in n for n in names)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_html_renders_in_headless_chromium(tapped_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, out = tapped_run
    shot = out / "screenshot.png"
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", "--window-size=1280,2400", "--hide-scrollbars",
         (out / "report.html").resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[:2] == (2400, 1280)

    # the page really rendered: the red MISMATCH badge (#c62828) and the green checksum cells (#2e9e4f)
    def has(color: tuple[int, int, int]) -> bool:
        return bool((np.abs(img.astype(int) - np.array(color)).sum(axis=2) < 12).sum() > 50)

    assert has((0xC6, 0x28, 0x28)) and has((0x2E, 0x9E, 0x4F))
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # text, images and plots, not a blank page
