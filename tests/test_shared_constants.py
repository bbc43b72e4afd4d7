"""Facts more than one layer needs, each kept once in the lowest module that owns it (the layer contracts
allow sharing only downwards): the app's name, where a project keeps the model image, the ROM's baud."""

from __future__ import annotations

from pathlib import Path

from esptool.loader import ESPLoader

from harness.chips import ROM_BAUD
from harness.firmware import generate as gen
from harness.flashfmt.model_image import MODEL_IMAGE, parse_model_image
from harness.protocol.app_image import APP_NAME

MODELS = Path(__file__).parent / "data" / "models"


def test_the_generated_project_takes_its_names_from_the_one_place(tmp_path: Path) -> None:
    """The CMake project() name (ESP-IDF names the app's .bin and .elf after it, the builders and the sim
    look for those) and the model image's path (generate writes it, the builders flash it)."""
    (p,) = gen.generate_projects(
        MODELS / "op_zoo.tflite", [], "esp32-devkitc", out_dir=tmp_path, variants=("ansi",),
        features=gen.FirmwareFeatures(embed_inputs=False),
    )  # fmt: skip
    assert f"\nproject({APP_NAME})\n" in (p.path / "CMakeLists.txt").read_text(encoding="utf-8")
    assert MODEL_IMAGE.startswith(f"{gen.DATA_DIR}/")
    assert (
        parse_model_image((p.path / MODEL_IMAGE).read_bytes()).model
        == (MODELS / "op_zoo.tflite").read_bytes()
    )


def test_the_rom_baud_is_esptools() -> None:
    assert ESPLoader.ESP_ROM_BAUD == ROM_BAUD
