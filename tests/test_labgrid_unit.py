"""The labgrid pieces that need no lab: labgrid-client output parsers (fuzzed), the holder tag,
process identity, inventory ``place`` entries. The texts are written in the shape labgrid-client 26
prints them (see tests/test_labgrid_e2e.py for the real thing)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.device.labgrid import (
    HolderTag,
    LabgridClient,
    PlaceInfo,
    PlaceLease,
    parse_env,
    parse_show,
    pid_namespace,
    process_alive,
    process_start,
    serial_url_of,
)
from harness.errors import LabgridError, PlanError
from harness.runner.inventory import _place_board_name, load_inventory

SHOW = """Place 'lab-s3':
  comment: shelf 2, left
  tags: esp_check=4242_123456_4026531836_abcd12efgh, esp_check_type=esp32s3-devkitc-1-n8r8
  matches:
    bench1/s3/*
  acquired: ci-1/runner
  acquired resources:
    bench1/s3/NetworkSerialPort/NetworkSerialPort
  created: 2026-11-30 14:35:00.448476
  changed: 2026-11-30 14:35:05.206042
  reservation: ABCD12EFGH
Acquired resource 'NetworkSerialPort' (bench1/s3/NetworkSerialPort/NetworkSerialPort):
  {'acquired': 'lab-s3',
   'avail': True,
   'params': {'host': '127.0.0.1', 'port': 4001}}
"""

ENV = """targets:
  lab-s3:
    resources:
    - NetworkSerialPort:
        port: 4001
        host: lab-pi-1.lab
        speed: 115200
        protocol: rfc2217
    - NetworkPowerPort:
        model: gude
        host: pdu-1
        index: 1
"""


def test_show_is_read_as_labgrid_prints_it():
    info = parse_show("lab-s3", SHOW)
    assert info.acquired == "ci-1/runner" and info.reservation == "ABCD12EFGH"
    assert info.tags["esp_check_type"] == "esp32s3-devkitc-1-n8r8" and info.comment == "shelf 2, left"
    assert info.holder_tag == HolderTag(4242, 123456, 4026531836, "ABCD12EFGH")
    # a tag without its acquisition time (esp-check < 0.2): labgrid's "changed" is only the last change
    assert (
        "ci-1/runner (esp-check pid 4242, comment 'shelf 2, left', place last changed 2026-11-30"
        in info.describe_holder()
    )
    idle = parse_show("x", "Place 'x':\n  matches:\n  acquired: None\n  acquired resources:\n")
    assert idle.acquired is None and idle.holder_tag is None and idle.describe_holder() == "nobody"


def test_the_holder_is_described_with_its_acquisition_time_not_the_places_last_change():
    acquired = 1_796_000_000  # a time of its own, not the place's last change
    shown = SHOW.replace("4026531836_abcd12efgh", f"4026531836_abcd12efgh_{acquired}")
    info = parse_show("lab-s3", shown)
    assert info.holder_tag == HolderTag(4242, 123456, 4026531836, "ABCD12EFGH", acquired)
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(acquired))
    said = info.describe_holder()
    assert f"acquired {at}, " in said and " s ago" in said and "changed" not in said, said


def test_a_tag_left_by_an_earlier_acquisition_says_nothing_about_the_holder_now():
    later = parse_show("lab-s3", SHOW.replace("reservation: ABCD12EFGH", "reservation: ZZZZ9999"))
    assert later.holder_tag is not None and later.current_tag is None
    assert "esp-check pid" not in later.describe_holder()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_show_parser_never_raises_on_hostile_text(text: str):
    info = parse_show("p", text)
    assert isinstance(info, PlaceInfo)
    assert info.reservation is None or info.reservation.isalnum()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_holder_tag_parser_takes_only_its_own_shape(value: str):
    tag = HolderTag.parse(value)
    if tag is not None:
        assert HolderTag.parse(tag.value()) == tag


def test_holder_tag_round_trip_is_lower_case():
    tag = HolderTag(17, 99, 5, "Q7ZLW5OJRO")
    assert tag.value() == "17_99_5_q7zlw5ojro" and HolderTag.parse(tag.value()) == tag
    timed = HolderTag(17, 99, 5, "Q7ZLW5OJRO", 1_796_000_000)
    assert timed.value() == "17_99_5_q7zlw5ojro_1796000000" and HolderTag.parse(timed.value()) == timed
    assert HolderTag.mine("ABCD1234").since > 0
    assert HolderTag.parse("17_99_q7zlw5ojro") is None and HolderTag.parse("x_99_5_abcd") is None


def test_only_a_process_gone_from_this_pid_namespace_is_judged_dead():
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(done.stdout)
    assert HolderTag(gone, 0, pid_namespace(), "ABCD1234").is_dead_here()
    assert not HolderTag(gone, 0, pid_namespace() + 1, "ABCD1234").is_dead_here()  # another container
    assert not HolderTag.mine("ABCD1234").is_dead_here()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = process_start(child.pid)
        assert not HolderTag(child.pid, start, pid_namespace(), "ABCD1234").is_dead_here()  # alive
        reused = HolderTag(child.pid, start + 7, pid_namespace(), "ABCD1234")  # that pid, another process
        assert reused.is_dead_here() == (start != 0)
    finally:
        child.kill()
        child.wait()


def test_env_gives_the_serial_port_url():
    res = parse_env(ENV)
    assert [c for c, _ in res] == ["NetworkSerialPort", "NetworkPowerPort"]
    assert serial_url_of("lab-s3", res) == "rfc2217://lab-pi-1.lab:4001?ign_set_control"
    raw = [("NetworkSerialPort", {"host": "::1", "port": 5, "protocol": "raw"})]
    assert serial_url_of("p", raw) == "socket://[::1]:5"
    with pytest.raises(LabgridError, match="has no NetworkSerialPort"):
        serial_url_of("p", [("NetworkPowerPort", {})])
    with pytest.raises(LabgridError, match="2 NetworkSerialPorts"):
        serial_url_of("p", res[:1] * 2)
    with pytest.raises(LabgridError, match="no usable host/port"):
        serial_url_of("p", [("NetworkSerialPort", {"host": "h", "port": "4001; rm -rf /"})])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_env_parser_raises_only_labgrid_errors(text: str):
    try:
        res = parse_env(text)
    except LabgridError:
        return
    assert all(isinstance(c, str) and isinstance(a, dict) for c, a in res)


def test_process_identity_survives_pid_reuse_checks():
    me = os.getpid()
    assert process_alive(me, process_start(me))
    assert not process_alive(me, process_start(me) + 1) or process_start(me) == 0
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert not process_alive(int(done.stdout), 0)  # exited (and reaped)
    assert not process_alive(0, 0) and not process_alive(-1, 0)


def test_inventory_places_need_a_coordinator(tmp_path: Path):
    inv = tmp_path / "bench.toml"
    inv.write_text('[[board]]\nname = "a"\ntype = "sim"\nplace = "lab-a"\n')
    with pytest.raises(PlanError, match="needs a labgrid coordinator"):
        load_inventory(inv)
    board = load_inventory(inv, coordinator="lab:20408").boards[0]
    assert (board.place, board.coordinator, board.can_power_cycle) == ("lab-a", "lab:20408", True)
    inv.write_text('[labgrid]\ncoordinator = "c:1"\n\n' + inv.read_text())
    assert load_inventory(inv).boards[0].coordinator == "c:1"
    assert load_inventory(inv, coordinator="d:2").boards[0].coordinator == "d:2"
    inv.write_text('[labgrid]\nhost = "c:1"\n\n[[board]]\nname = "a"\ntype = "sim"\nplace = "lab-a"\n')
    with pytest.raises(PlanError, match=r"\[labgrid\]"):
        load_inventory(inv)


def test_discovered_place_names_become_valid_board_names():
    assert _place_board_name("s3-1") == "s3-1"
    odd = _place_board_name("../weird place ü")
    assert odd.startswith("place-") and "/" not in odd and " " not in odd
    assert _place_board_name("a b") != _place_board_name("a_b")


class _SlowReleaseClient(LabgridClient):
    """Faked at the edge: labgrid-client itself. ``release`` blocks until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", exe="labgrid-client-not-run", timeout=10.0)
        self.calls: list[str] = []
        self.in_release = threading.Event()
        self.finish_release = threading.Event()

    def run(self, *args: str, place: str | None = None) -> str:
        self.calls.append(args[0])
        if args[0] == "release":
            self.in_release.set()
            assert self.finish_release.wait(10)
            self.calls.append("released")
        return ""

    def set_tag(self, place: str, key: str, value: str) -> None:
        self.calls.append("untag")

    def cancel(self, token: str) -> None:
        self.calls.append("cancel")


def test_a_second_release_waits_for_the_one_in_flight():
    """A board worker releasing its place when a hard stop comes: the run's final release must not return
    (and the process exit) before the place is released."""
    client = _SlowReleaseClient()
    lease = PlaceLease(client, "p")
    lease.acquired_at, lease.token = time.monotonic(), "tok"
    worker = threading.Thread(target=lease.release)
    worker.start()
    assert client.in_release.wait(10)
    assert lease.is_releasing and not lease.is_locked  # what release_places reads to say so
    second_returned = threading.Event()

    def final_release() -> None:
        lease.release()
        client.calls.append("second returned")
        second_returned.set()

    final = threading.Thread(target=final_release)
    final.start()
    assert not second_returned.wait(0.3)  # still in flight: the second caller waits for it
    client.finish_release.set()
    final.join(10)
    worker.join(10)
    assert second_returned.is_set() and client.calls.count("release") == 1  # released once, not twice
    assert client.calls.index("released") < client.calls.index("second returned")
    assert not lease.is_releasing
