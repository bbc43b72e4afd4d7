"""labgrid overhead per attempt: what holding a free place costs esp-check (``PlaceLease``).

A real lab on 127.0.0.1 (tests/labgrid_lab.py: labgrid-coordinator, labgrid-exporter, one
``esp-check sim serve --rfc2217`` board exported as a NetworkSerialPort). Each attempt is what the
runner does around a task: ``PlaceLease.acquire`` (reserve, acquire, tag, find the serial port) then
``release``. Prints, per phase, the median wall time of --repeat attempts and the number of
labgrid-client processes launched, plus one ``labgrid-client places`` launch for scale. Nothing here
asserts timing.

Usage: python bench/bench_labgrid.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.device.labgrid import LabgridClient, PlaceLease  # noqa: E402
from tests.labgrid_lab import Lab  # noqa: E402


class CountingClient(LabgridClient):
    """labgrid-client as esp-check runs it, counting the processes it starts."""

    launches = 0

    def argv(self, *args: str, place: str | None = None) -> list[str]:
        CountingClient.launches += 1
        return super().argv(*args, place=place)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-labgrid-") as tmp:
        lab = Lab(Path(tmp)).start(["b1"])
        try:
            lab.make_place("p1", "b1")
            client = CountingClient(lab.coordinator)
            t0 = time.perf_counter()
            client.places()
            one = time.perf_counter() - t0
            acq, rel, launches = [], [], []
            for _ in range(args.repeat):
                CountingClient.launches = 0
                lease = PlaceLease(client, "p1")
                t0 = time.perf_counter()
                lease.acquire(60.0)
                t1 = time.perf_counter()
                lease.release()
                t2 = time.perf_counter()
                acq.append(t1 - t0)
                rel.append(t2 - t1)
                launches.append(CountingClient.launches)
        finally:
            lab.stop()
    n = args.repeat
    print(f"one labgrid-client launch (places):        {one:.2f} s")
    print(f"acquire a free place, median of {n}:        {statistics.median(acq):.2f} s")
    print(f"release it, median of {n}:                  {statistics.median(rel):.2f} s")
    total = statistics.median(a + r for a, r in zip(acq, rel, strict=True))
    print(f"labgrid overhead per attempt, median of {n}: {total:.2f} s")
    print(f"labgrid-client launches per attempt:       {statistics.median(launches):.0f}")


if __name__ == "__main__":
    main()
