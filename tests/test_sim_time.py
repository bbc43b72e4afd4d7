"""The simulated board's time model keeps the firmware's idle-task tick (a tick per invoke cost a
chip 10 s per 1,000 inputs; the firmware now sleeps one tick at most once a second of invokes).

Nothing is faked: the pure time-model function, checked against the constant in the generated firmware.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness.sim.resident import FREERTOS_TICK_S, IDLE_TICK_EVERY_S, idle_tick

APP_MAIN = Path(__file__).resolve().parents[1] / "firmware_templates" / "project" / "main" / "app_main.cc.j2"


def test_the_model_ticks_as_often_as_the_firmware() -> None:
    every_us = int(re.search(r"kIdleTickEveryUs = (\d+);", APP_MAIN.read_text()).group(1))  # type: ignore[union-attr]
    assert every_us / 1e6 == IDLE_TICK_EVERY_S
    assert FREERTOS_TICK_S == 0.01  # ESP-IDF's default CONFIG_FREERTOS_HZ=100


def test_one_tick_per_second_of_back_to_back_invokes() -> None:
    since, extra = 0.0, 0.0
    for _ in range(250):  # 250 invokes of 10 ms: 2.5 s busy, 2 ticks
        tick, since = idle_tick(since, 0.010)
        extra += tick
    assert abs(extra - 2 * FREERTOS_TICK_S) < 1e-9
    assert idle_tick(0.999, 0.0) == (0.0, 0.999)  # no modelled time, no tick
