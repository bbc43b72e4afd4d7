"""A labgrid lab on 127.0.0.1 for the tests: real labgrid-coordinator, labgrid-exporter, labgrid-client.

What is real: labgrid's coordinator, exporter and client (the released PyPI package, run as the
commands a lab runs), ``esp-check sim serve --rfc2217`` processes exported as NetworkSerialPort
resources, labgrid's NetworkPowerDriver (``simplerest`` model) talking HTTP. What is faked: the
boards (the simulator) and the power switch: a tiny HTTP server in the test process that records
what labgrid asked it (the outermost edge).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def labgrid_tool(name: str, bin_dir: Path = BIN) -> str | None:
    beside = bin_dir / name
    return str(beside) if beside.exists() else shutil.which(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PowerSwitch(http.server.ThreadingHTTPServer):
    """The fake PDU: ``GET /outlet/<index>/<0|1>`` switches, ``GET /outlet/<index>`` reads."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.state: dict[int, str] = {}
        switch = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                m = re.fullmatch(r"/outlet/(\d+)(?:/([01]))?", self.path)
                if not m:
                    self.send_error(404)
                    return
                index = int(m.group(1))
                if m.group(2) is not None:
                    switch.calls.append((index, m.group(2)))
                    switch.state[index] = m.group(2)
                body = switch.state.get(index, "1").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/outlet/{{index}}/{{value}}"


@dataclass
class Lab:
    """Coordinator + one exporter + one ``sim serve --rfc2217`` per board; places made on request."""

    dir: Path
    bin: Path = BIN  # the environment whose labgrid and esp-check run (a fresh venv in the install test)
    coordinator: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    sim_ports: dict[str, int] = field(default_factory=dict)
    power: PowerSwitch | None = None

    def start(self, boards: list[str], sim_args: dict[str, list[str]] | None = None) -> Lab:
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.coordinator = f"127.0.0.1:{port}"
        self._spawn("coordinator", [labgrid_tool("labgrid-coordinator", self.bin), "-l", self.coordinator])
        serving = {name: self._sim_serve(name, (sim_args or {}).get(name, [])) for name in boards}
        for name, proc in serving.items():  # all start side by side, with the coordinator
            self.sim_ports[name] = self._sim_port(name, proc)
        self.power = PowerSwitch()
        self._write_exporter_config(boards)
        self._spawn(
            "exporter",
            [labgrid_tool("labgrid-exporter", self.bin), "-c", self.coordinator, "-n", "bench1", "--hostname",
             "127.0.0.1", str(self.dir / "exporter.yaml")],
        )  # fmt: skip
        self._wait_resources(len(boards))
        return self

    def _spawn(
        self, label: str, argv: list[str | None], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        assert all(argv), f"{label}: labgrid is not installed"
        log = open(self.dir / f"{label}.log", "w")  # noqa: SIM115 - the process keeps it open
        proc = subprocess.Popen(
            [str(a) for a in argv], cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
            env=env or dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def _sim_serve(self, name: str, extra: list[str]) -> subprocess.Popen:
        argv = [str(self.bin / "esp-check"), "sim", "serve", "--name", name, "--rfc2217", "--port", "0"]
        return self._spawn(f"sim-{name}", argv + extra)

    def _sim_port(self, name: str, proc: subprocess.Popen) -> int:
        """The port ``sim serve`` says it listens on (its log)."""
        log = self.dir / f"sim-{name}.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"rfc2217://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            if m:
                return int(m.group(1))
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"sim serve {name} did not start: {log.read_text()}")

    def _write_exporter_config(self, boards: list[str]) -> None:
        assert self.power is not None
        lines = []
        for i, name in enumerate(boards):
            lines += [
                f"{name}:",
                "  NetworkSerialPort:",
                "    host: 127.0.0.1",
                f"    port: {self.sim_ports[name]}",
                "    speed: 115200",
                "    protocol: rfc2217",
                "  NetworkPowerPort:",
                "    model: simplerest",
                f"    host: '{self.power.url}'",
                f"    index: {i}",
            ]
        (self.dir / "exporter.yaml").write_text("\n".join(lines) + "\n")

    def _wait_resources(self, n: int) -> None:
        deadline = time.monotonic() + 60
        out = ""
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.CalledProcessError):
                out = self.client("resources")
                if len(out.split()) >= 2 * n:
                    return
            time.sleep(0.2)
        raise AssertionError(f"exporter resources did not appear: {out!r}\n{self.logs()}")

    def client(self, *args: str, place: str | None = None, user: str | None = None) -> str:
        """Run labgrid-client against the lab (``user``: as another user, LG_USERNAME)."""
        env = dict(os.environ)
        if user:
            env["LG_USERNAME"] = user
        argv = [
            labgrid_tool("labgrid-client", self.bin),
            "-x",
            self.coordinator,
            *(("-p", place) if place else ()),
            *args,
        ]
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc.stdout

    def make_place(self, place: str, board: str, board_type: str = "sim") -> None:
        self.client("create", place=place)
        with ThreadPoolExecutor(2) as pool:  # two independent changes: side by side
            done = [
                pool.submit(self.client, "add-match", f"bench1/{board}/*", place=place),
                pool.submit(self.client, "set-tags", f"esp_check_type={board_type}", place=place),
            ]
            for one in done:
                one.result()

    def show(self, place: str) -> str:
        return self.client("show", place=place)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.dir.glob("*.log")
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.power is not None:
            self.power.shutdown()
            self.power.server_close()
