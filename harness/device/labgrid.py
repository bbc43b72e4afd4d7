"""Boards in a labgrid lab: places reserved, acquired and released through ``labgrid-client``.

Only through labgrid's documented command-line client (a subprocess: labgrid's grpc/asyncio machinery
and its own ``serial`` package stay out of esp-check's process). A :class:`PlaceLease` is the labgrid
counterpart of :class:`harness.device.locks.BoardLock`: waiting in line, acquiring, the ``esp_check``
tag that tells a dead esp-check run's stale acquisition, releasing, and the place's serial port are
docs/ci.md, "A lab on labgrid".
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.errors import BoardBusyError, LabgridError

TAG = "esp_check"  # the tag key esp-check puts on a place it holds
TYPE_TAG = "esp_check_type"  # the board type of a place, for `esp-check run --labgrid` without inventory
CONSOLE_TAG = "esp_check_console"  # optional: uart | usb_serial_jtag
_TOKEN = re.compile(r"[A-Z0-9]{4,64}")
_TAG_VALUE = re.compile(r"([0-9]+)_([0-9]+)_([0-9]+)_([A-Za-z0-9]{4,64})(?:_([0-9]+))?")  # HolderTag.value
_INSTALL_HINT = "install labgrid beside esp-check: pip install 'esp-check[labgrid]' (docs/ci.md)"
# The coordinator allocates a free place when the reservation is made, and `reserve --wait` sees it
# at its first poll (later polls come every 1 s): a place not allocated this long after the token is
# someone else's (acquired, or reserved), and only then is it read and the wait clock started
ALLOCATION_GRACE_S = 1.5
REPORT_EVERY_S = 5.0  # how often a wait says who holds the place


def _background(
    fn: Callable[..., object], *args: str, errors: list[LabgridError] | None = None
) -> threading.Thread:
    """Run one labgrid-client call in a thread (calls that need not wait for each other overlap);
    a LabgridError goes to ``errors`` (or is dropped: best-effort clean-up calls)."""

    def run() -> None:
        try:
            fn(*args)
        except LabgridError as exc:
            if errors is not None:
                errors.append(exc)

    thread = threading.Thread(target=run, name="labgrid-client", daemon=True)
    thread.start()
    return thread


def find_client() -> str:
    """The ``labgrid-client`` executable: on PATH, else next to this Python (an unactivated venv)."""
    found = shutil.which("labgrid-client")
    if found:
        return found
    beside = Path(sys.executable).parent / ("labgrid-client.exe" if os.name == "nt" else "labgrid-client")
    if beside.exists():
        return str(beside)
    raise LabgridError("labgrid-client was not found on PATH", hint=_INSTALL_HINT)


def identity() -> str:
    """``host/user`` as labgrid-client reports this process's acquisitions (LG_HOSTNAME/LG_USERNAME)."""
    host = os.environ.get("LG_HOSTNAME") or socket.gethostname()
    user = os.environ.get("LG_USERNAME") or getpass.getuser()
    return f"{host}/{user}"


def process_start(pid: int) -> int:
    """A process's start time in clock ticks since boot (Linux), 0 where it cannot be read.

    With the pid it identifies a process across pid reuse: a dead runner's pid given to another
    process later has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return 0
    # the command name (field 2) is in parentheses and may hold spaces: split after its last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    with contextlib.suppress(IndexError, ValueError):
        return int(fields[19])  # field 22 of proc(5); fields[0] is field 3
    return 0


def process_alive(pid: int, start: int) -> bool:
    """Is process ``pid`` (started at ``start``, 0 = unknown) still running on this host?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    except OSError:
        return False
    now = process_start(pid)
    return not (start and now and now != start)


def pid_namespace() -> int:
    """This process's PID namespace (Linux ``/proc/self/ns/pid`` inode), 0 where unknown.

    Two containers may share a host name and user: a pid is only judged in the namespace it lives in.
    """
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return 0
    m = re.search(r"\[(\d+)\]", link)
    return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class HolderTag:
    """What the ``esp_check`` tag on a place says about the esp-check process holding it."""

    pid: int
    start: int  # process start (clock ticks since boot), 0: unknown
    ns: int  # PID namespace, 0: unknown
    token: str  # the reservation the place was acquired under
    since: int = 0  # when the place was acquired (Unix time, s), 0: unknown (a tag of esp-check < 0.2)

    def value(self) -> str:
        # lower case: labgrid's tag values are meant to be [a-z0-9_]; tokens are [A-Z0-9]
        since = f"_{self.since}" if self.since else ""
        return f"{self.pid}_{self.start}_{self.ns}_{self.token.lower()}{since}"

    @classmethod
    def parse(cls, value: str) -> HolderTag | None:
        m = _TAG_VALUE.fullmatch(value.strip())
        if m is None:
            return None
        pid, start, ns, token, since = m.groups()
        return cls(int(pid), int(start), int(ns), token.upper(), int(since or 0))

    @classmethod
    def mine(cls, token: str) -> HolderTag:
        pid = os.getpid()
        return cls(pid, process_start(pid), pid_namespace(), token, int(time.time()))

    def is_dead_here(self) -> bool:
        """True only when the process is known to be gone: same PID namespace, pid gone or reused."""
        if self.pid == os.getpid() or self.ns != pid_namespace():
            return False  # this process, or one this process cannot see: never judged dead
        return not process_alive(self.pid, self.start)


@dataclass
class PlaceInfo:
    """A place as ``labgrid-client -p NAME show`` prints it (only the fields esp-check uses)."""

    name: str
    acquired: str | None = None  # "host/user"
    tags: dict[str, str] = field(default_factory=dict)
    comment: str = ""
    changed: str = ""
    reservation: str | None = None

    @property
    def holder_tag(self) -> HolderTag | None:
        value = self.tags.get(TAG)
        return HolderTag.parse(value) if value else None

    @property
    def current_tag(self) -> HolderTag | None:
        """The esp-check tag when it belongs to the acquisition in place now (same reservation); a tag
        left by an earlier esp-check acquisition says nothing about a later holder."""
        tag = self.holder_tag
        return tag if tag is not None and self.acquired and tag.token == self.reservation else None

    def describe_holder(self) -> str:
        """``host/user`` plus what is known: the esp-check pid and acquisition time, the comment."""
        who = self.acquired or "nobody"
        tag = self.current_tag
        parts = [f"esp-check pid {tag.pid}"] if tag else []
        if self.comment:
            parts.append(f"comment {self.comment!r}")
        if tag is not None and tag.since:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tag.since))
            parts.append(f"acquired {at}, {max(0, int(time.time()) - tag.since)} s ago")
        elif self.changed:  # labgrid shows no acquisition time: its last change is all there is
            parts.append(f"place last changed {self.changed}")
        return who + (f" ({', '.join(parts)})" if parts else "")


def parse_show(name: str, text: str) -> PlaceInfo:
    """Parse ``labgrid-client -p NAME show``: the place's own lines (two-space indent, ``key: value``).

    Resource lines after them (``Acquired resource ...``) are ignored; unknown keys too. Hostile or
    garbled text yields a PlaceInfo with what could be read, never an exception.
    """
    info = PlaceInfo(name)
    for line in text.splitlines():
        if not line.startswith("  ") or line.startswith("   "):
            continue
        key, sep, value = line.strip().partition(": ")
        if not sep:
            continue
        value = value.strip()
        if key == "acquired":
            info.acquired = None if value in ("None", "") else value
        elif key == "tags":
            info.tags = dict(kv.split("=", 1) for kv in (p.strip() for p in value.split(",")) if "=" in kv)
        elif key == "comment":
            info.comment = value[:200]
        elif key == "changed":
            info.changed = value[:40]
        elif key == "reservation":
            info.reservation = value if _TOKEN.fullmatch(value) else None
    return info


def parse_env(text: str) -> list[tuple[str, dict[str, object]]]:
    """``labgrid-client -p NAME env`` (YAML): the place's resources as ``(class, args)`` pairs."""
    import yaml  # lazy: ~11 ms; only a labgrid place's env is YAML, and every runner user imports this

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LabgridError(f"labgrid-client env printed no valid YAML: {exc}") from None
    out: list[tuple[str, dict[str, object]]] = []
    targets = doc.get("targets") if isinstance(doc, dict) else None
    for target in (targets or {}).values() if isinstance(targets, dict) else ():
        resources = target.get("resources") if isinstance(target, dict) else None
        for entry in resources if isinstance(resources, list) else ():
            if isinstance(entry, dict):
                out.extend((str(k), v if isinstance(v, dict) else {}) for k, v in entry.items())
    return out


def serial_url_of(place: str, resources: list[tuple[str, dict[str, object]]]) -> str:
    """The pyserial URL of the place's one NetworkSerialPort."""
    ports = [a for c, a in resources if c == "NetworkSerialPort"]
    if len(ports) != 1:
        what = "no NetworkSerialPort" if not ports else f"{len(ports)} NetworkSerialPorts"
        raise LabgridError(
            f"labgrid place {place} has {what}",
            hint="export the board's RFC 2217 server (esp_rfc2217_server) as the place's one "
            "NetworkSerialPort and match it to the place (docs/ci.md, 'labgrid')",
        )
    args = ports[0]
    host, port = str(args.get("host", "")), args.get("port")
    if not host or not isinstance(port, int) or not 0 < port < 65536:
        raise LabgridError(f"labgrid place {place}: NetworkSerialPort has no usable host/port: {args}")
    if host.count(":") > 1 and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal in a URL
    if str(args.get("protocol", "rfc2217")) == "raw":
        return f"socket://{host}:{port}"
    return f"rfc2217://{host}:{port}?ign_set_control"


class LabgridClient:
    """``labgrid-client -x COORDINATOR ...``: one subprocess per command, argv lists, no shell."""

    def __init__(self, coordinator: str, *, exe: str | None = None, timeout: float = 60.0) -> None:
        self.coordinator = coordinator
        self.exe = exe
        self.timeout = timeout

    def argv(self, *args: str, place: str | None = None) -> list[str]:
        exe = self.exe or find_client()
        return [exe, "-x", self.coordinator, *(("-p", place) if place else ()), *args]

    def env(self) -> dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1")

    def run(self, *args: str, place: str | None = None) -> str:
        """Run one command; its stdout, or :class:`LabgridError` with what labgrid-client said."""
        argv = self.argv(*args, place=place)
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout, env=self.env(), check=False
            )
        except subprocess.TimeoutExpired:
            raise LabgridError(
                f"labgrid-client {' '.join(args)} did not answer within {self.timeout:.0f} s "
                f"(coordinator {self.coordinator})",
                hint="is labgrid-coordinator running and reachable at that address?",
            ) from None
        except OSError as exc:
            raise LabgridError(f"cannot run {argv[0]}: {exc}", hint=_INSTALL_HINT) from None
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise LabgridError(
                f"labgrid-client {' '.join(args)}"
                + (f" (place {place})" if place else "")
                + f" failed (exit {proc.returncode}): {' / '.join(said[-3:])[:500]}",
                hint=f"coordinator {self.coordinator}; `labgrid-client -x {self.coordinator} places` lists "
                "the places",
            )
        return proc.stdout

    def places(self) -> list[str]:
        """Place names (``labgrid-client places``: name, aliases in parentheses, comment)."""
        return [line.split()[0] for line in self.run("places").splitlines() if line.strip()]

    def show(self, place: str) -> PlaceInfo:
        return parse_show(place, self.run("show", place=place))

    def set_tag(self, place: str, key: str, value: str) -> None:
        """Set (empty value: delete) one tag of the place."""
        self.run("set-tags", f"{key}={value}", place=place)

    def power_cycle(self, place: str) -> tuple[bool, str]:
        """``labgrid-client power cycle`` through the place's power resource (the place is held)."""
        try:
            out = self.run("power", "cycle", place=place)
        except LabgridError as exc:
            return False, exc.message
        return True, out.strip() or f"power cycled place {place} through labgrid"

    def cancel(self, token: str) -> None:
        with contextlib.suppress(LabgridError):
            self.run("cancel-reservation", token)


class _Reservation:
    """``labgrid-client reserve --wait --shell name=PLACE`` running in the background.

    Its first line (``export LG_TOKEN=...``) comes at once; it exits 0 when the coordinator has
    allocated the place to us. stdout goes to a temporary file: no pipe to drain, no reader thread.
    """

    def __init__(self, client: LabgridClient, place: str) -> None:
        self.client = client
        self._out: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._err: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        argv = client.argv("reserve", "--wait", "--shell", f"name={place}")
        try:
            self.proc = subprocess.Popen(argv, stdout=self._out, stderr=self._err, env=client.env())
        except OSError as exc:
            self.close()
            raise LabgridError(f"cannot run {argv[0]}: {exc}", hint=_INSTALL_HINT) from None
        self.token: str | None = None

    def poll(self) -> bool | None:
        """True: allocated; None: still waiting; raises LabgridError when the client failed."""
        if self.token is None:
            self._out.seek(0)
            m = re.search(r"LG_TOKEN=([A-Z0-9]+)", self._out.read())
            self.token = m.group(1) if m else None
        rc = self.proc.poll()
        if rc is None:
            return None
        if rc == 0 and self.token:
            return True
        self._err.seek(0)
        said = " / ".join(self._err.read().strip().splitlines()[-3:])[:500]
        raise LabgridError(
            f"labgrid-client reserve failed (exit {rc}): {said or 'no reservation token'}",
            hint=f"is labgrid-coordinator running at {self.client.coordinator}?",
        )

    def stop(self) -> threading.Thread | None:
        """End the waiting client and cancel the reservation it made, in the background (a
        ``cancel-reservation`` costs a labgrid-client start-up); returns that thread to join."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:  # it only waits: nothing to lose by killing it
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(LabgridError):  # the token it printed, if any
            self.poll()
        if not self.token:
            return None
        return _background(self.client.cancel, self.token)

    def close(self) -> None:
        for fh in (self._out, self._err):
            with contextlib.suppress(OSError):
                fh.close()


def place_key(place: str) -> str:
    """The key of a labgrid place's lease (:class:`PlaceLease`): its board lock, which the inventory's
    duplicate check compares with the other boards' ``lock_key``."""
    return f"labgrid-{place}"


class PlaceLease:
    """Exclusive use of one labgrid place: reserve (waiting visibly), acquire, tag; release.

    Each labgrid-client call is a process start-up, so a free place costs only the needed calls (no
    ``show``) and calls that need not wait for each other run side by side (docs/ci.md counts them).
    """

    def __init__(self, client: LabgridClient, place: str) -> None:
        self.client = client
        self.place = place
        self.key = place_key(place)
        self.me = identity()
        self.token: str | None = None
        self.url: str | None = None
        self.waited_s = 0.0
        self.acquired_at: float | None = None
        self._mutex = threading.Lock()
        # held for a whole release: a second caller (the run's final release_places while a board worker
        # is still releasing) waits for the one in flight instead of returning before the place is free
        self._releasing = threading.Lock()
        self._deadline: float | None = None  # set once the place is seen held by someone else
        self._seen: PlaceInfo | None = None  # the place as last read (for the busy message)
        self._background: list[threading.Thread] = []
        self._note: Callable[[str], None] = lambda _m: None

    @property
    def is_locked(self) -> bool:
        return self.acquired_at is not None

    @property
    def is_releasing(self) -> bool:
        """Another thread is releasing the place now (it is not free yet)."""
        return self._releasing.locked()

    # ---- waiting --------------------------------------------------------------------------------

    def acquire(
        self,
        timeout: float,
        *,
        on_wait: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        """Hold the place, or raise :class:`BoardBusyError` (exit 3) once someone else has held it for
        ``timeout`` seconds while we waited (when the clock runs: docs/ci.md "A lab on labgrid", step 1).
        ``on_note`` hears what the lease did beyond the obvious (a stale acquisition of ours released;
        default ``on_wait``).
        """
        say = on_wait or (lambda _m: None)
        self._note = on_note or say
        t0 = time.monotonic()
        self._deadline = None
        while True:
            res = _Reservation(self.client, self.place)  # starts while `show` runs
            allocated = False
            try:
                allocated = self._wait_allocated(res, timeout, say, cancel)
            finally:
                if not allocated:  # failed, cancelled or timed out: end the waiting client
                    self._keep(res.stop())
                res.close()
            if not allocated:
                raise self._busy(timeout, cancel)
            self.token = res.token
            if self._take(say):
                break
            self._held(timeout)  # someone acquired it by hand between allocation and our acquire
            if time.monotonic() >= (self._deadline or 0.0):
                raise self._busy(timeout, cancel)
        self.waited_s = time.monotonic() - t0

    def _held(self, timeout: float) -> None:
        """Start the wait clock: the place is held by someone else from now on."""
        if self._deadline is None:
            self._deadline = time.monotonic() + max(timeout, 0.0)

    def _first_look(self, timeout: float, say: Callable[[str], None]) -> None:
        """The place was not allocated to us at once: read it (an unknown place or a dead coordinator
        raises now), release our own stale acquisition, else start the clock and say who holds it."""
        info = self._clear_own_stale(strict=True)
        if info is not None and info.acquired is None and info.reservation is None:
            return  # free now (a stale acquisition of ours was released): ours at the next poll
        self._held(timeout)  # acquired, or allocated to someone else's reservation
        if info is not None and info.acquired:
            say(f"waiting for labgrid place {self.place}: acquired by {info.describe_holder()}")

    def _wait_allocated(
        self,
        res: _Reservation,
        timeout: float,
        say: Callable[[str], None],
        cancel: threading.Event | None,
    ) -> bool:
        """Poll the waiting reservation. A free place is allocated at once and costs no other call;
        otherwise look at the place once, then report its holder every ``REPORT_EVERY_S``."""
        started = time.monotonic()
        answered: float | None = None  # when the coordinator handed out our reservation token
        next_report: float | None = None  # None: not looked at the place yet
        while True:
            if res.poll():
                return True
            now = time.monotonic()
            if answered is None and res.token:
                answered = now
            if answered is None and now - started >= self.client.timeout:
                raise LabgridError(
                    f"labgrid-client reserve got no reservation from {self.client.coordinator} within "
                    f"{self.client.timeout:.0f} s",
                    hint="is labgrid-coordinator running and reachable at that address?",
                )
            if next_report is None and answered is not None and now - answered >= ALLOCATION_GRACE_S:
                self._first_look(timeout, say)
                now = time.monotonic()
                next_report = now + REPORT_EVERY_S
            if (cancel is not None and cancel.is_set()) or now >= (self._deadline or float("inf")):
                return False
            if next_report is not None and now >= next_report:
                info = self._clear_own_stale()
                if info is not None and info.acquired:
                    say(f"waiting for labgrid place {self.place}: acquired by {info.describe_holder()}")
                next_report = now + REPORT_EVERY_S
            time.sleep(0.05)

    def _busy(self, timeout: float, cancel: threading.Event | None) -> BoardBusyError:
        if cancel is not None and cancel.is_set():
            return BoardBusyError(f"stopped while waiting for labgrid place {self.place}")
        seen = self._seen  # as read while waiting: no further labgrid-client call before saying so
        holder = seen.describe_holder() if seen is not None and seen.acquired else "someone else"
        release = f"labgrid-client -x {self.client.coordinator} -p {self.place} release"
        return BoardBusyError(
            f"labgrid place {self.place} is still acquired by {holder} after waiting {timeout:.0f} s "
            f"(if that acquisition is stale, its owner or an operator releases it: {release} --kick)",
            hint="wait for the other user, or raise --lock-timeout / [run] lock_timeout_s",
        )

    def _clear_own_stale(self, *, strict: bool = False) -> PlaceInfo | None:
        """Release the place if esp-check on this host and user left it acquired and died (what counts
        as stale: docs/ci.md "A lab on labgrid", step 4). Returns the place as seen (None: unreadable;
        ``strict``: raise).
        """
        try:
            info = self.client.show(self.place)
        except LabgridError:
            if strict:
                raise
            return None
        self._seen = info
        tag = info.holder_tag
        if info.acquired != self.me or tag is None or tag.token != info.reservation:
            return info
        if not tag.is_dead_here():
            return info  # a live esp-check process (or one in another PID namespace) holds it: wait
        try:
            self.client.run("release", place=self.place)
        except LabgridError as exc:
            self._note(f"labgrid place {self.place}: could not release a stale acquisition: {exc.message}")
            return info
        self._keep(_background(self.client.cancel, tag.token))
        self._note(
            f"labgrid place {self.place}: released a stale acquisition by esp-check pid {tag.pid} "
            f"on {self.me} (that process is gone: killed or crashed)"
        )
        info.acquired = None
        return info

    # ---- holding --------------------------------------------------------------------------------

    def _take(self, say: Callable[[str], None]) -> bool:
        """Acquire the place allocated to our reservation, then tag it and find its serial port."""
        assert self.token is not None
        try:
            self.client.run("acquire", place=self.place)
        except LabgridError as exc:
            say(f"labgrid place {self.place}: acquire failed, queueing again: {exc.message}")
            self._keep(_background(self.client.cancel, self.token))
            self.token = None
            return False
        with self._mutex:
            self.acquired_at = time.time()
        tag = HolderTag.mine(self.token).value()
        errors: list[LabgridError] = []
        tagging = _background(self.client.set_tag, self.place, TAG, tag, errors=errors)
        try:
            self.url = serial_url_of(self.place, parse_env(self.client.run("env", place=self.place)))
            tagging.join()
            if errors:
                raise errors[0]
        except LabgridError:
            tagging.join()
            self.release()
            raise
        return True

    def release(self) -> None:
        """Untag and cancel the reservation (side by side), then release; safe to call twice and from
        another thread: a call while another is in flight returns once that one has released the place.
        Untagging goes first so that it can never land on the next holder's tag."""
        with self._releasing:
            self._release()

    def _release(self) -> None:
        with self._mutex:
            background, self._background = self._background, []
            held, token = self.acquired_at is not None, self.token
            self.acquired_at, self.token = None, None
        steps = [_background(self.client.cancel, token)] if token else []
        if held:
            steps.append(_background(self.client.set_tag, self.place, TAG, ""))
        for thread in steps:
            thread.join(timeout=self.client.timeout)
        if held:
            with contextlib.suppress(LabgridError):
                self.client.run("release", place=self.place)
        for thread in background:
            thread.join(timeout=self.client.timeout)

    def _keep(self, thread: threading.Thread | None) -> None:
        if thread is not None:
            with self._mutex:
                self._background.append(thread)
