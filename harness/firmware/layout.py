"""The flash layout of a board, generated from its flash size (docs/firmware.md "Flash layout").

The table depends on the board only, never on the model or the inputs, so changing either rewrites
neither the table nor, when the generated code is unchanged, an app. The partitions and the largest model
a board takes are in that docs section.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.chips import CHIPS
from harness.errors import GenerateError
from harness.firmware.boards import Board
from harness.flashfmt.model_image import HEADER_BYTES, PARTITION_LABEL, PARTITION_SUBTYPE
from harness.flashfmt.partitions import (
    APP,
    DATA,
    OTA_0,
    OTADATA,
    SUBTYPE_NAMES,
    VARIANT_SLOTS,
    Partition,
    app_partition,
)

OTADATA_OFFSET = 0x10000
OTADATA_BYTES = 0x2000  # two sectors, as ESP-IDF's otadata always is
FIRST_APP_OFFSET = 0x20000  # apps start on 64 KB boundaries (MMU page)


def app_slot_bytes(flash_bytes: int) -> int:
    """Size of each app slot: 1 MB (TFLM + ESP-NN + esp-check without the model), 512 KB on 2 MB flash."""
    return 0x80000 if flash_bytes <= (2 << 20) else 0x100000


@dataclass(frozen=True)
class FlashLayout:
    board: str
    chip: str
    flash_bytes: int
    table_offset: int
    rows: tuple[Partition, ...]

    def row(self, name: str) -> Partition:
        return next(r for r in self.rows if r.label == name)

    @property
    def app_slot_bytes(self) -> int:
        return self.row("ota_0").size

    @property
    def model_partition(self) -> Partition:
        return self.row(PARTITION_LABEL)

    @property
    def mmap_window_bytes(self) -> int:
        return CHIPS[self.chip].mmap_window_bytes  # (a Board naming another chip is refused when made)

    @property
    def model_max_bytes(self) -> int:
        """Largest .tflite the board takes: partition minus header, and what the data window leaves."""
        by_partition = self.model_partition.size - HEADER_BYTES
        by_window = self.mmap_window_bytes - self.app_slot_bytes - HEADER_BYTES
        return max(0, min(by_partition, by_window))

    def slot_offset(self, variant: str) -> int:
        return app_partition(self.rows, variant, f"board {self.board}").offset

    def csv(self) -> str:
        return "\n".join(r.csv() for r in self.rows) + "\n"

    def to_dict(self) -> dict[str, object]:
        return {
            "flash_bytes": self.flash_bytes,
            "partition_table_offset": self.table_offset,
            "partitions": [_row_dict(r) for r in self.rows],
            "app_slot_bytes": self.app_slot_bytes,
            "model_partition_bytes": self.model_partition.size,
            "mmap_window_bytes": self.mmap_window_bytes,
            "model_max_bytes": self.model_max_bytes,
            "slots": {v: app_partition(self.rows, v, f"board {self.board}").label for v in VARIANT_SLOTS},
        }


def _row_dict(row: Partition) -> dict[str, object]:
    tname, sub = row.type_names()
    return {"name": row.label, "type": tname, "subtype": sub, "offset": row.offset, "size": row.size}


def flash_layout(board: Board) -> FlashLayout:
    """The partition table for ``board`` (GenerateError when its flash cannot hold two apps and a model).

    The board's partition table offset leaves nvs room below otadata (checked when the board file is
    loaded: :func:`harness.firmware.boards.parse_board`)."""
    table = board.partition_table_offset
    nvs = table + 0x1000
    slot = app_slot_bytes(board.flash_bytes)
    model_off = FIRST_APP_OFFSET + 2 * slot
    model_size = board.flash_bytes - model_off
    if model_size < 0x10000:
        raise GenerateError(
            f"board {board.name}: {board.flash_size} of flash leaves no room for a model partition after "
            f"two {slot // 1024} KB app slots",
            hint="use a board with at least 2 MB of flash",
        )
    rows = (
        Partition("nvs", DATA, SUBTYPE_NAMES["data"]["nvs"], nvs, OTADATA_OFFSET - nvs),
        Partition("otadata", DATA, OTADATA, OTADATA_OFFSET, OTADATA_BYTES),
        Partition("ota_0", APP, OTA_0, FIRST_APP_OFFSET, slot),
        Partition("ota_1", APP, OTA_0 + 1, FIRST_APP_OFFSET + slot, slot),
        Partition(PARTITION_LABEL, DATA, PARTITION_SUBTYPE, model_off, model_size),
    )
    return FlashLayout(board.name, board.chip, board.flash_bytes, table, rows)


def check_model_fits(layout: FlashLayout, model_bytes: int, model_name: str) -> None:
    """GenerateError (exit 2, before anything is built) for a model larger than the board takes."""
    if model_bytes <= layout.model_max_bytes:
        return
    mp = layout.model_partition.size
    why = (
        f"its model partition holds {mp - HEADER_BYTES} bytes"
        if mp - HEADER_BYTES <= layout.mmap_window_bytes - layout.app_slot_bytes - HEADER_BYTES
        else f"{layout.chip} maps at most {layout.mmap_window_bytes // (1 << 20)} MB of flash for data, "
        f"one app slot of it taken by the app"
    )
    raise GenerateError(
        f"{model_name} is {model_bytes} bytes, but board {layout.board} takes models up to "
        f"{layout.model_max_bytes} bytes: {why}",
        hint="use a smaller model (fewer or quantized weights) or a board with more flash "
        "(`esp-check boards` lists each board's limit)",
    )
