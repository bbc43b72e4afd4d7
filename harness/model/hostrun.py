"""The host reference and the arena probe, in one child process with a memory limit and a timeout.

Why a child, its limits, what a crash or a refusal (SIGABRT after an announced Invoke) becomes and how
results are cached: README "Host reference backends and platforms" and docs/sweep.md "When the host
reference refuses". One child does everything a command needs: reference outputs for the inputs, per
layer if asked, and TFLM's arena measurement with a confirming run at exactly that size. The simulated
board's CPU is a child of its own (:class:`InvokeChild`: one model kept loaded, invoked input by input).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict, TypeVar, cast

import numpy as np

from harness import children
from harness.errors import (
    EspCheckError,
    HostReferenceError,
    InputDataError,
    ModelError,
    ReferenceRefusedError,
    UsageError,
)
from harness.model import backends
from harness.model.backends import ReferenceResult, ReferenceRun, get_backend, tflm_available
from harness.model.loader import ModelInfo, parse_model_bytes
from harness.protocol.spec import crc32
from harness.resources import atomic_write, code_digest, user_cache_dir

FORMAT = 1
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MB = 4096
CACHE_MAX_BYTES = 512 * 1024**2
_SAY = "@HOSTRUN "  # prefix of the child's result lines on stdout
_INTERPRETER = {"tflm": "TFLM's", "litert": "LiteRT's"}
_T = TypeVar("_T")


class _Job(TypedDict):
    """job.json: what the parent asks of the child."""

    backend: str
    per_layer: bool
    runs: int | None
    arena: bool
    memory_bytes: int


class _Said(TypedDict, total=False):
    """One result line of the child (``stage`` names it; the other keys belong to some stages)."""

    stage: str
    run: int | None
    total: int
    head: int | None
    tail: int | None
    version: str
    kind: str
    message: str
    hint: str | None


@dataclass(frozen=True)
class ArenaMeasurement:
    """TFLM's recording allocator on the 64-bit host (see :mod:`harness.model.arena`)."""

    total: int
    head: int | None
    tail: int | None
    verified: bool  # a second run in an arena of exactly ``total`` (16-aligned) bytes succeeded
    backend_version: str


@dataclass(frozen=True)
class HostResults:
    """What one call obtained (from the cache, or from one child process)."""

    reference: ReferenceResult | None
    arena: ArenaMeasurement | None


def limits() -> tuple[float, int]:
    """(timeout seconds, memory bytes) for the child, from the environment or the defaults."""
    out: list[float] = []
    for var, default in (
        ("ESP_CHECK_REFERENCE_TIMEOUT", DEFAULT_TIMEOUT_S),
        ("ESP_CHECK_REFERENCE_MEMORY_MB", float(DEFAULT_MEMORY_MB)),
    ):
        text = os.environ.get(var, "")
        try:
            value = float(text) if text else default
        except ValueError:
            value = -1.0
        if not (0 < value < 1e7):
            raise UsageError(
                f"{var}={text!r} is not a positive number", hint=f"unset it or set e.g. {default:g}"
            )
        out.append(value)
    return out[0], int(out[1] * 1024 * 1024)


@functools.cache
def _code_id() -> str:
    """A digest of the code that computes the results (read once per process)."""
    return code_digest(f"format {FORMAT}", Path(__file__).parent, ("backends.py", "hostrun.py"), ())


def _digest(*parts: object) -> str:
    """A cache key of ``parts`` and of the code that computes the results: never a stale result."""
    return hashlib.sha256(json.dumps([_code_id(), *parts]).encode()).hexdigest()


def _array_id(array: np.ndarray) -> str:
    c = np.ascontiguousarray(array)
    return f"{c.dtype.str}:{list(c.shape)}:{hashlib.sha256(c.tobytes()).hexdigest()}"


def _loadz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **cast("dict[str, Any]", arrays))
    return buf.getvalue()


# ---- the on-disk cache: files <key>.npz (reference outputs) and <key>.json (arena) ------------------


def _cache_get(key: str, ext: str, read: Callable[[Path], _T]) -> _T | None:
    path = user_cache_dir("host-reference") / f"{key}.{ext}"  # $ESP_CHECK_CACHE_DIR or the user cache
    try:
        value = read(path)
    except FileNotFoundError:
        return None
    except Exception:  # an entry that does not read as one (damaged, another shape) is a miss, replaced
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used goes first
    return value


def _cache_put(key: str, ext: str, data: bytes | str) -> None:
    """Write ``<key>.<ext>`` atomically, then evict the least recently used entries over the cap; a cache
    that cannot be written only keeps nothing."""
    root = user_cache_dir("host-reference")
    with contextlib.suppress(OSError):
        atomic_write(root / f"{key}.{ext}", data, durable=False)
        entries = [(p.stat().st_mtime, p.stat().st_size, p) for p in root.iterdir() if p.is_file()]
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= CACHE_MAX_BYTES * 0.8:
                break
            with contextlib.suppress(OSError):  # (another process's eviction took it)
                path.unlink()
                total -= size


# ---- parent side ------------------------------------------------------------------------------------


def _runs_from_arrays(
    arrays: dict[str, np.ndarray], info: ModelInfo, n_runs: int, per_layer: bool
) -> list[ReferenceRun]:
    runs: list[ReferenceRun] = []
    slots = backends.layer_slots(info)
    for k in range(n_runs):
        outputs = [arrays[f"r{k}_o{o}"] for o in range(len(info.outputs))]
        layers = None
        if per_layer:
            layered = [(slot, arrays[f"r{k}_l{j}"]) for j, slot in enumerate(slots)]
            layers = [backends.LayerTensor(*slot, arr, crc32(arr)) for slot, arr in layered]
        runs.append(ReferenceRun(outputs=outputs, layers=layers))
    return runs


def _arrays_from_runs(runs: Sequence[ReferenceRun]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for k, run in enumerate(runs):
        for o, a in enumerate(run.outputs):
            arrays[f"r{k}_o{o}"] = np.asarray(a)
        for j, lt in enumerate(run.layers or []):
            arrays[f"r{k}_l{j}"] = lt.array
    return arrays


def host_results(
    model_bytes: bytes,
    info: ModelInfo,
    runs: Sequence[Sequence[np.ndarray]],
    *,
    backend: str = "tflm",
    per_layer: bool = False,
    reference: bool = True,
    arena: bool = False,
    stop: threading.Event | None = None,
) -> HostResults:
    """Reference outputs of ``runs`` (if ``reference``) and TFLM's arena measurement (if ``arena``
    and the tflite-micro wheel is importable), from the cache or from one child process.

    ``info`` must be :func:`~harness.model.loader.parse_model_bytes` of ``model_bytes`` and ``runs``
    arrays that fit it. Raises ModelError when the model crashes the interpreter or needs more than
    the memory limit, HostReferenceError when the backend is missing, fails or times out. Setting
    ``stop`` (from another thread) kills the child at once: HostReferenceError "stopped".
    """
    ref: ReferenceResult | None = None
    measured: ArenaMeasurement | None = None
    ref_key = arena_key = version = ""
    impl = None
    if reference:
        impl = get_backend(backend)
        version = impl.version()  # from the wheel's metadata: missing -> HostReferenceError, no child
        ids = [[_array_id(a) for a in run] for run in runs]
        keys = [_digest("reference", info.sha256, ids, impl.name, version, lay) for lay in (per_layer, True)]
        ref_key = keys[0]
        for key in dict.fromkeys(keys):  # a per-layer entry holds the outputs too
            arrays = _cache_get(key, "npz", _loadz)
            with contextlib.suppress(KeyError):  # (an entry without the layers asked for)
                if arrays is not None:
                    got = _runs_from_arrays(arrays, info, len(runs), per_layer)
                    ref = ReferenceResult(impl.name, version, got, info.sha256, impl.kernels)
                    break
    arena = arena and backends.tflm_installed()
    if arena:
        arena_key = _digest("arena", info.sha256, backends.TflmBackend().version())
        measured = _cache_get(arena_key, "json", lambda p: ArenaMeasurement(**json.loads(p.read_bytes())))
    need_ref = reference and ref is None
    need_arena = arena and measured is None and tflm_available()  # a miss: the wheel must import
    if not (need_ref or need_arena):
        return HostResults(ref, measured)
    if need_ref and impl is not None:
        impl.load()  # the interpreter imports here, or HostReferenceError and no child
    name = impl.name if impl is not None else "tflm"
    child_runs, child_arena = _run_child(
        model_bytes,
        info,
        runs if need_ref else None,
        backend=name,
        per_layer=per_layer,
        arena=need_arena,
        stop=stop,
    )
    if need_ref:
        assert impl is not None and child_runs is not None
        _cache_put(ref_key, "npz", _npz(_arrays_from_runs(child_runs)))
        ref = ReferenceResult(impl.name, version, child_runs, info.sha256, impl.kernels)
    if need_arena and child_arena is not None:
        _cache_put(arena_key, "json", json.dumps(dataclasses.asdict(child_arena)))
        measured = child_arena
    return HostResults(ref, measured)


def _child_argv(job_dir: Path) -> list[str]:
    """The child's command line (tests replace it to fake a crashing interpreter)."""
    return [sys.executable, "-m", "harness.model.hostrun", str(job_dir)]


def _child_env() -> dict[str, str]:
    """The environment of a child: it must import this very package, also from a checkout not installed."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


INVOKE_IDLE_S = 10  # an InvokeChild's child leaves after this long without an input (a new one follows)


class InvokeChild:
    """One model in TFLM's reference interpreter in a child process of its own, invoked input by input:
    the simulated board's CPU. A kernel that aborts (a TFLITE_CHECK) or crashes ends the child, not the
    process serving the board; the next run starts a new one. The child leaves by itself when its input
    ends (this object or its process gone) or after :data:`INVOKE_IDLE_S` without one, so it is not
    registered with :mod:`harness.children` and never outlives esp-check."""

    def __init__(self, model: bytes, info: ModelInfo) -> None:
        self.model, self.info = model, info
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: bytes | None = None  # what the running child said once it had the model

    def allocates(self) -> bool:
        """Whether TFLM's AllocateTensors accepts the model (what the firmware's Setup checks); starts the
        child if none runs."""
        return self._start() != b"\2"

    def _start(self) -> bytes | None:
        """A running child (started if there is none): what it said once it had the model (``\\0``:
        allocated, ``\\2``: AllocateTensors failed; None: it ended)."""
        if self.proc is None or self.proc.poll() is not None:
            argv = [sys.executable, "-m", "harness.model.hostrun", "--invoke"]
            pipe, quiet = subprocess.PIPE, subprocess.DEVNULL  # TFLM's own messages are not the console
            self.proc = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=quiet, env=_child_env())
            # reaped as it leaves (idle, its input's end, a crash): no zombie in a long-lived process
            threading.Thread(target=self.proc.wait, name="esp-check-sim-cpu", daemon=True).start()
            head = struct.pack("<QQ", backends.host_arena_bytes(self.info), limits()[1])
            proc = self.proc
            assert proc.stdin is not None and proc.stdout is not None  # both are pipes
            with contextlib.suppress(BrokenPipeError):
                _put(proc.stdin, head + self.model)
            self.ready = _get(proc.stdout)
        return self.ready

    def _send(self, arr: np.ndarray) -> tuple[bytes | None, int]:
        """``arr`` to a running child (one is started if there is none): its answer (None: it ended) and
        its exit status (0 while it runs)."""
        ready = self._start()
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None  # both are pipes
        if ready != b"\0":
            return ready, 0 if ready is not None else proc.wait()
        with contextlib.suppress(BrokenPipeError):  # a child gone already: no answer
            _put(proc.stdin, np.ascontiguousarray(arr).tobytes())
        said = _get(proc.stdout)
        return said, 0 if said is not None else proc.wait()

    def run(self, arr: np.ndarray) -> list[np.ndarray]:
        """The outputs of one Invoke; RuntimeError: TFLM's Invoke returned an error or the interpreter
        refused the model; ReferenceRefusedError: the child aborted (SIGABRT); ModelError: a signal
        killed it."""
        said, code = self._send(arr)
        if code == -signal.SIGALRM:  # it left, idle, as the input came: a new one runs it
            said, code = self._send(arr)
        if code == -signal.SIGABRT:
            raise ReferenceRefusedError("TFLM's reference interpreter aborted (SIGABRT) inside Invoke")
        if code < 0:
            raise ModelError(f"TFLM's reference interpreter was killed by signal {-code} inside Invoke")
        if said is None or said[:1] != b"\0" or len(said) != 1 + sum(t.nbytes for t in self.info.outputs):
            raise RuntimeError(f"TFLM's reference interpreter, its Invoke or outputs failed (exit {code})")
        out, at = [], 1
        for t in self.info.outputs:
            dtype = np.dtype(t.dtype)
            out.append(np.frombuffer(said, dtype, t.nbytes // dtype.itemsize, at).reshape(t.shape))
            at += t.nbytes
        return out


def _put(stream: IO[bytes], data: bytes) -> None:
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _get(stream: IO[bytes]) -> bytes | None:
    """One message from ``stream``, or None at its end (the other side is gone)."""
    head = stream.read(4)
    size = struct.unpack("<I", head)[0] if len(head) == 4 else -1
    data = stream.read(size) if size >= 0 else b""
    return data if len(data) == size else None


def invoke_main() -> int:  # pragma: no cover - runs in the child process
    """Entry of an :class:`InvokeChild`: the model in, a status byte out (2: AllocateTensors failed, the
    child ends), then each input in, its outputs out (a status byte first: 1 when TFLM's Invoke returned
    an error)."""
    head = _get(sys.stdin.buffer)
    if head is None:
        return 2
    arena, memory = struct.unpack_from("<QQ", head)
    _limit_resources(memory)
    model = head[16:]
    info = parse_model_bytes(model)
    rt = get_backend("tflm").load()
    try:
        interp, runs, tin = rt.Interpreter.from_bytes(model, arena_size=arena), 0, info.inputs[0]
    except (RuntimeError, ValueError):  # AllocateTensors failed (a kernel's Prepare refused the model)
        _put(sys.stdout.buffer, b"\2")
        return 0
    _put(sys.stdout.buffer, b"\0")
    while True:
        signal.alarm(INVOKE_IDLE_S)  # SIGALRM ends the child: idle too long
        data = _get(sys.stdin.buffer)
        signal.alarm(0)
        if data is None:
            return 0
        if runs:
            interp.reset()
        runs += 1
        try:
            interp.set_input(np.frombuffer(data, np.dtype(tin.dtype)).reshape(tin.shape), 0)
            interp.invoke()
        except RuntimeError:
            _put(sys.stdout.buffer, b"\1")
            continue
        # each output at its declared size, as the firmware prints its TfLiteTensor (TFLM's reshape makes a
        # declared shape [0] a scalar: a byte more at run time, which must not shift the next outputs)
        outs = [interp.get_output(i).tobytes()[: t.nbytes] for i, t in enumerate(info.outputs)]
        _put(sys.stdout.buffer, b"\0" + b"".join(outs))


def _spawn(
    job_dir: Path, timeout: float, stop: threading.Event | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the child to its end; kill it on the timeout, when ``stop`` is set, or on any exception here
    (Ctrl-C, SIGTERM), as ``subprocess.run`` does."""
    argv = _child_argv(job_dir)
    with (
        children.start(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=_child_env(),
        ) as proc,
        children.tracked(proc),
    ):  # registered: a run abandoned by a second signal does not leave it
        try:
            out, err = _communicate(proc, timeout, stop)
        except BaseException:
            proc.kill()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _communicate(
    proc: subprocess.Popen[str], timeout: float, stop: threading.Event | None
) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:  # short waits when another thread may stop us
            return proc.communicate(timeout=0.2 if stop is not None else timeout)
        except subprocess.TimeoutExpired as exc:
            stopped = stop is not None and stop.is_set()
            if not stopped and time.monotonic() < deadline:
                continue
            proc.kill()
            proc.communicate()
            if stopped:
                raise HostReferenceError("the host reference was stopped (its child process killed)") from exc
            raise HostReferenceError(
                f"the host reference did not finish within {timeout:g} s (child process stopped)",
                hint="a slow or overloaded machine? set ESP_CHECK_REFERENCE_TIMEOUT=<seconds> to allow more",
            ) from exc


# how the child names the errors it reports (any other EspCheckError: "reference")
_ERROR_KINDS: dict[str, type[EspCheckError]] = {
    "model": ModelError,
    "input": InputDataError,
    "reference": HostReferenceError,
}


def _child_error(doc: _Said, interpreter: str, memory: int) -> EspCheckError:
    kind, message, hint = str(doc.get("kind")), str(doc.get("message")), doc.get("hint")
    hint = str(hint) if hint else None
    if kind == "memory":
        return ModelError(
            f"this model needs more than the {memory // 2**20} MiB of memory the host reference may use "
            f"({message})",
            hint="a corrupted model (tensor sizes) is the usual cause; if it is genuine, raise "
            "ESP_CHECK_REFERENCE_MEMORY_MB",
        )
    if kind in _ERROR_KINDS:
        return _ERROR_KINDS[kind](message, hint=hint)
    return HostReferenceError(f"{interpreter} reference interpreter failed: {message}", hint=hint)


def _refused(run: object, interpreter: str) -> ReferenceRefusedError:
    """The child aborted after announcing an Invoke: a kernel's check (TFLITE_CHECK) refused the values."""
    k = run if isinstance(run, int) else None
    on = f"input run {k}" if k is not None else "all-zero inputs (its arena probe)"
    return ReferenceRefusedError(
        f"{interpreter} reference interpreter refuses this model: it aborted (SIGABRT) inside Invoke "
        f"on {on}, after loading the model and allocating its tensors; one of its kernels' checks "
        "(TFLITE_CHECK) rejects these values",
        hint="the device's esp-nn kernels may still return values here: flash-and-compare runs both "
        "variants and reports what they gave (exit 1, never a match)",
        run=k,
    )


def _run_child(
    model_bytes: bytes,
    info: ModelInfo,
    runs: Sequence[Sequence[np.ndarray]] | None,
    backend: str,
    per_layer: bool,
    arena: bool,
    stop: threading.Event | None = None,
) -> tuple[list[ReferenceRun] | None, ArenaMeasurement | None]:
    """Start the child for the missing results and turn what it says (or how it died) into results."""
    timeout, memory = limits()
    interpreter = _INTERPRETER.get(backend, backend)
    with tempfile.TemporaryDirectory(prefix="esp-check-host-") as tmp:
        job_dir = Path(tmp)
        (job_dir / "model.tflite").write_bytes(model_bytes)
        if runs is not None:
            arrays = {f"r{k}_i{i}": a for k, run in enumerate(runs) for i, a in enumerate(run)}
            (job_dir / "inputs.npz").write_bytes(_npz(arrays))
        n_runs = None if runs is None else len(runs)
        job = _Job(backend=backend, per_layer=per_layer, runs=n_runs, arena=arena, memory_bytes=memory)
        (job_dir / "job.json").write_text(json.dumps(job), encoding="utf-8")
        proc = _spawn(job_dir, timeout, stop)
        said: dict[str, _Said] = {}
        last = ""
        for line in proc.stdout.splitlines():
            if line.startswith(_SAY):
                with contextlib.suppress(ValueError):
                    doc = json.loads(line[len(_SAY) :])
                    last = str(doc.get("stage"))
                    said[last] = doc
        if "error" in said:
            raise _child_error(said["error"], interpreter, memory)
        done_ref = runs is None or "reference" in said
        complete = done_ref and (not arena or "measured" in said)
        if proc.returncode < 0 and not complete:
            num = -proc.returncode
            if num == signal.SIGABRT and last == "invoke":
                raise _refused(said["invoke"].get("run"), interpreter)
            stage = "measuring its tensor arena" if done_ref else "running it"
            name = next((s.name for s in signal.Signals if s == num), "unknown signal")
            raise ModelError(
                f"this model crashes {interpreter} reference interpreter: signal {num} ({name}) "
                f"while {stage}",
                hint="the device's TFLM would likely crash the same way: check the model file (re-export or "
                "re-copy it; compare its sha256 with the original)",
            )
        if proc.returncode >= 0 and (proc.returncode != 0 or not complete):
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no output"
            raise HostReferenceError(f"the host reference child failed (exit {proc.returncode}): {tail}")
        ref_runs = None
        if runs is not None:
            ref_runs = _runs_from_arrays(_loadz(job_dir / "reference.npz"), info, len(runs), per_layer)
    measured = None
    if arena:
        m = said["measured"]
        measured = ArenaMeasurement(
            int(m["total"]), m.get("head"), m.get("tail"), "verified" in said, str(m["version"])
        )
    return ref_runs, measured


# ---- child side ----------------------------------------------------------------------------------------


def _say(doc: _Said) -> None:
    sys.stdout.write(_SAY + json.dumps(doc) + "\n")
    sys.stdout.flush()


def _limit_resources(memory: int) -> None:
    """Address-space limit (MemoryError instead of exhausting the host) and no core files."""
    try:
        import resource  # not at the top: POSIX only
    except ImportError:  # Windows: only the timeout applies
        return
    for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, memory)):
        with contextlib.suppress(ValueError, OSError):
            _soft, hard = resource.getrlimit(res)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(res, (cap, hard))


def _allocations(job_dir: Path, model: bytes, info: ModelInfo) -> _Said:
    """TFLM's allocation report, printed by C++ to fd 2: captured into a file, then parsed."""
    report = job_dir / "allocations.txt"
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 2)
        backends.record_arena(model, info)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)
    text = report.read_text(errors="replace")

    def size(key: str) -> int | None:
        m = re.search(rf"Arena allocation {key} (\d+) bytes", text)
        return int(m.group(1)) if m else None

    total = size("total")
    if total is None:
        shown = text.strip()[-200:] or "nothing"
        raise HostReferenceError(f"TFLM printed no arena allocation report ({shown})")
    return {"stage": "measured", "total": total, "head": size("head"), "tail": size("tail")}


def _child_job(job_dir: Path, job: _Job) -> None:
    model = (job_dir / "model.tflite").read_bytes()
    info = parse_model_bytes(model)
    if job["runs"] is not None:
        with np.load(job_dir / "inputs.npz", allow_pickle=False) as z:
            runs = [[z[f"r{k}_i{i}"] for i in range(len(info.inputs))] for k in range(int(job["runs"]))]
        result = get_backend(job["backend"]).run(model, info, runs, bool(job["per_layer"]))
        if len(result) != len(runs) or any(
            len(r.layers or []) != len(backends.layer_slots(info)) for r in result if job["per_layer"]
        ):
            raise HostReferenceError("the backend returned fewer runs or layers than asked for")
        (job_dir / "reference.npz").write_bytes(_npz(_arrays_from_runs(result)))
        _say({"stage": "reference"})
    if job["arena"]:
        found = _allocations(job_dir, model, info)
        _say({**found, "version": backends.TflmBackend().version()})
        try:
            backends.run_on_zeros(model, info, (found["total"] + 15) // 16 * 16)
        except (RuntimeError, ValueError) as exc:  # too small after all: the figure stays, unconfirmed
            _say({"stage": "unverified", "message": str(exc)[:200]})
        else:
            _say({"stage": "verified"})


def child_main(job_dir: Path) -> int:  # pragma: no cover - runs in the child process
    """Entry of the child: run the job in ``job_dir``, report each finished stage on stdout."""
    job: _Job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    _limit_resources(int(job["memory_bytes"]))
    backends.set_invoke_hook(lambda run: _say({"stage": "invoke", "run": run}))
    try:
        _child_job(job_dir, job)
        return 0
    except MemoryError as exc:
        error: _Said = {"kind": "memory", "message": f"MemoryError: {exc}"[:300]}
    except EspCheckError as exc:
        kind = next((k for k, cls in _ERROR_KINDS.items() if isinstance(exc, cls)), "reference")
        error = {"kind": kind, "message": exc.message, "hint": exc.hint}
    except Exception as exc:
        tb = traceback.format_exc().strip().splitlines()[-3:]
        error = {"kind": "unexpected", "message": f"{type(exc).__name__}: {exc} ({' | '.join(tb)})"}
    _say({"stage": "error", **error})
    return 1


if __name__ == "__main__":  # pragma: no cover - child process entry
    if sys.argv[1:] == ["--invoke"]:
        sys.exit(invoke_main())
    sys.exit(child_main(Path(sys.argv[1])) if len(sys.argv) == 2 else 2)
