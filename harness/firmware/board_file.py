"""The board file's typed model (pydantic): what ``boards/*.toml`` may hold, its defaults and ranges,
written once; docs/schemas/board.schema.json is generated from :class:`BoardFile`.

Apart from :mod:`harness.firmware.boards` so that loading a board whose validated form is already
stored (``boards.load_board_file``) imports no pydantic: a repeat CLI run does not pay for it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from harness.chips import BOARD_CHIPS
from harness.firmware.board_types import (
    DEFAULT_PARTITION_TABLE_OFFSET,
    NAME_PATTERN,
    Builder,
    Console,
    EspnnPath,
    FlashSize,
    Psram,
    ResetStyle,
)
from harness.userfiles import UserModel


def _known_chip(chip: str) -> str:
    if chip not in BOARD_CHIPS:
        raise ValueError(f"is {chip!r}; expected one of: {', '.join(BOARD_CHIPS)}")
    return chip


Baud = Annotated[int, Field(ge=9600, le=5_000_000, description="a baud rate")]
Text = Annotated[str, Field(max_length=200)]


class NativeTable(UserModel):
    """``[native]`` of a native board (builder = "native")."""

    bits: Literal[32, 64] = Field(64, description="word size of the host program")


class BoardFile(UserModel):
    """A board file (``boards/*.toml``) as written; :func:`parse_board` checks the combinations."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case, digits, - _ .")]
    description: Text
    chip: Annotated[str, AfterValidator(_known_chip), Field(json_schema_extra={"enum": list(BOARD_CHIPS)})]
    pio_board: Annotated[str, Field(pattern=r"^([a-z0-9][a-z0-9_.-]{0,63})?$")]
    flash_size: FlashSize
    psram: Psram
    psram_mb: Annotated[int, Field(ge=0, le=64)]
    internal_ram_arena_kb: Annotated[int, Field(ge=8, le=1024, description="largest arena in internal RAM")]
    console: Console
    flash_baud: Baud
    monitor_baud: Baud
    reset: ResetStyle
    cpu_mhz: Annotated[int, Field(gt=0)]
    espnn_path: EspnnPath
    builder: Builder
    simulated: bool = False
    default_port: Annotated[str, Field(pattern=r"^[\x21-\x7e]{1,200}$")] | None = None
    sdkconfig: dict[str, str] = Field(default_factory=dict, description="extra sdkconfig.defaults lines")
    # simulator settings (the sim:// URL parameters; validated by harness.sim)
    sim: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")], str | int | float | bool] = Field(
        default_factory=dict
    )
    native: NativeTable | None = None
    idf_min: str | None = Field(None, description="oldest ESP-IDF this board needs, MAJOR.MINOR.PATCH")
    chip_rev_min: str | None = Field(None, description='chip revisions the image accepts, "major.minor"')
    chip_rev_max: str | None = None
    partition_table_offset: int = DEFAULT_PARTITION_TABLE_OFFSET
    psram_memtest: bool = Field(False, description="ESP-IDF's PSRAM memory test at every boot (costs time)")
    link_baud: Baud = Field(921600, description="the resident loop's top baud after HELLO (UART consoles)")
