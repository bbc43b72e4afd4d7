"""The one sdkconfig line parser (harness/firmware/sdkconfig.py) and its readers: the generator's allow-list
check, the builders' resolved sdkconfig and config/sdkconfig.json, the native Kconfig stand-in. Each rule is
esp-idf-kconfig's (kconfiglib's ``_load_config``): what kconfgen would read, and nothing it would not."""

from __future__ import annotations

import pytest

from harness.errors import BuildError, GenerateError
from harness.firmware import build as b
from harness.firmware import generate as gen
from harness.firmware import sdkconfig
from harness.firmware.native.config import parse_defaults, resolve


@pytest.mark.parametrize(
    ("line", "symbols", "malformed"),
    [
        ("CONFIG_A=y", {"CONFIG_A": "y"}, []),
        ("CONFIG_A=y  \r", {"CONFIG_A": "y"}, []),  # trailing whitespace is dropped
        ('CONFIG_S="a \\"q\\""', {"CONFIG_S": '"a \\"q\\""'}, []),  # a string keeps its quotes
        ("# CONFIG_A is not set", {"CONFIG_A": "n"}, []),
        ("CONFIG_A=n", {"CONFIG_A": "n"}, []),  # the same as "is not set"
        ("# CONFIG_A=y", {}, []),  # a commented-out assignment is a comment
        ("#CONFIG_A is not set", {}, []),  # "# CONFIG_" exactly, or it is a comment
        ("   # CONFIG_A is not set", {}, []),
        ("# comment", {}, []),
        ("", {}, []),
        ("  CONFIG_A=y", {}, ["  CONFIG_A=y"]),  # kconfgen: "ignoring malformed line"
        ("CONFIG_A = y", {}, ["CONFIG_A = y"]),  # no symbol is called "A "
        ("CONFIG_A is not set", {}, ["CONFIG_A is not set"]),
        ("A=y", {}, ["A=y"]),
    ],
)
def test_lines_read_as_kconfgen_reads_them(line: str, symbols: dict[str, str], malformed: list[str]) -> None:
    assert sdkconfig.parse(line + "\n") == (symbols, malformed)


def test_the_last_assignment_wins_and_strings_unescape() -> None:
    text = "CONFIG_A=y\nCONFIG_B=1\n# CONFIG_A is not set\n"
    assert sdkconfig.parse(text).symbols == {"CONFIG_A": "n", "CONFIG_B": "1"}
    assert sdkconfig.defined({"CONFIG_A": "n", "CONFIG_B": "1", "CONFIG_S": '"n"'}) == {
        "CONFIG_B": "1",
        "CONFIG_S": '"n"',
    }
    assert sdkconfig.unquote('"a \\"q\\" \\\\"') == 'a "q" \\' and sdkconfig.unquote("0x10") == "0x10"
    assert sdkconfig.is_string('"1"') and not sdkconfig.is_string("1") and not sdkconfig.is_string('"a"b"')


def test_sdkconfig_json_follows_kconfgen() -> None:
    """Fails on the old reader: it read every "is not set" line first (so a later one lost to an earlier
    assignment) and turned a quoted number into an integer; kconfgen keeps the last value and writes a
    string symbol as a string."""
    text = 'CONFIG_A=y\n# CONFIG_A is not set\nCONFIG_APP_PROJECT_VER="1"\n'
    assert b.sdkconfig_json(text) == {"A": False, "APP_PROJECT_VER": "1"}


def test_the_readers_agree_on_one_file() -> None:
    text = (
        'CONFIG_IDF_TARGET="esp32"\nCONFIG_NN_ANSI_C=y\n# CONFIG_NN_OPTIMIZED is not set\n'
        "# CONFIG_ESP_TASK_WDT_INIT=y\nCONFIG_ESP_TASK_WDT_TIMEOUT_S=30\n"
    )
    defaults = parse_defaults(text)
    assert defaults == sdkconfig.parse(text).symbols
    assert gen.check_sdkconfig(text, "esp32", gen.load_allowlist(), "t") == list(defaults)
    assert b.parse_sdkconfig(text) == {
        "CONFIG_IDF_TARGET": "esp32",
        "CONFIG_NN_ANSI_C": "y",
        "CONFIG_ESP_TASK_WDT_TIMEOUT_S": "30",
    }
    assert b.sdkconfig_json(text) == {
        "IDF_TARGET": "esp32",
        "NN_ANSI_C": True,
        "NN_OPTIMIZED": False,
        "ESP_TASK_WDT_TIMEOUT_S": 30,
    }
    assert resolve(defaults)["CONFIG_NN_OPTIMIZATIONS"] == "0"


def test_allowlist_check_reads_a_commented_out_line_as_a_comment() -> None:
    """Fails on the old check: it read "# CONFIG_ESP_CONSOLE_UART_CUSTOM=y" as the assignment, so the baud
    passed its `requires`, while ESP-IDF would drop it and talk at 115200."""
    text = (
        'CONFIG_IDF_TARGET="esp32"\n# CONFIG_ESP_CONSOLE_UART_CUSTOM=y\n'
        "CONFIG_ESP_CONSOLE_UART_BAUDRATE=921600\n"
    )
    with pytest.raises(GenerateError, match="takes effect only with CONFIG_ESP_CONSOLE_UART_CUSTOM=y"):
        gen.check_sdkconfig(text, "esp32", gen.load_allowlist(), "t")


def test_allowlist_check_refuses_a_line_kconfgen_would_ignore() -> None:
    """Fails on the old check: it skipped a line its pattern did not match, which ESP-IDF ignores too."""
    for line in ("CONFIG_ESP_TASK_WDT_TIMEOUT_S = 30", "  CONFIG_ESP_TASK_WDT_TIMEOUT_S=30"):
        with pytest.raises(GenerateError, match="neither a Kconfig assignment nor a comment"):
            gen.check_sdkconfig(f'CONFIG_IDF_TARGET="esp32"\n{line}\n', "esp32", gen.load_allowlist(), "t")


def test_native_standin_refuses_what_esp_idf_would_ignore() -> None:
    """Fails on the old native reader: it stripped an indented "CONFIG_NN_ANSI_C=y" and built the ANSI C
    kernels, where ESP-IDF ignores the line and builds the optimized ones."""
    with pytest.raises(BuildError, match="not a Kconfig assignment"):
        parse_defaults('CONFIG_IDF_TARGET="esp32"\n  CONFIG_NN_ANSI_C=y\n')
    # and "#CONFIG_X is not set" is a comment to kconfgen: the default stays
    assert parse_defaults('CONFIG_IDF_TARGET="esp32"\n#CONFIG_NN_OPTIMIZED is not set\n') == {
        "CONFIG_IDF_TARGET": '"esp32"'
    }
