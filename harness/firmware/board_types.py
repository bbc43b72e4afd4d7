"""The plain types and defaults of a board file's fields, shared by :mod:`harness.firmware.boards`
(which loads boards) and :mod:`harness.firmware.board_file` (their pydantic model, imported only when a
board file is validated): no pydantic here."""

from __future__ import annotations

from typing import Literal

Psram = Literal["none", "quad", "octal", "hex"]
Console = Literal["uart", "usb_serial_jtag"]
ResetStyle = Literal["classic", "usb_serial_jtag"]
EspnnPath = Literal["generic", "s3", "p4"]
Builder = Literal["pio", "idf", "sim", "native"]
FlashSize = Literal["2MB", "4MB", "8MB", "16MB", "32MB"]
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"  # a board's name: lower-case, digits, - _ .

# Where the partition table goes unless a board says otherwise. ESP-IDF's default 0x8000 leaves the
# ESP32-P4 bootloader (at 0x2000) about 1.4 KB of headroom; esp-tflite-micro's examples moved the table
# to 0xc000 on every target for that reason, and so do we. The layout after it (partitions.csv.j2):
# nvs from the table's next sector up to the app at APP_OFFSET.
DEFAULT_PARTITION_TABLE_OFFSET = 0xC000
