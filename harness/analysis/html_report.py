"""``--html FILE`` and ``--bundle FILE.zip`` for ``flash-and-compare``, and the hybrid report's HTML.

This module computes what the Jinja2 templates (``harness/templates/*.html.j2``, autoescaped) show; what
the report and the bundle hold: docs/tap.md, "HTML report and bundle".
"""

from __future__ import annotations

import base64
import functools
import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np
from PIL import Image

from harness import __version__
from harness.analysis.hybrid import Audit
from harness.analysis.tap import TapResult, Timing, divergences, timing_cells
from harness.errors import write_error
from harness.resources import write_output

if TYPE_CHECKING:  # annotations only: the flows import this module
    from harness.flows.records import FlashAndCompareResult

View = dict[str, object]  # what a template shows: numbers, strings and lists of views, built here
ReportDoc = Mapping[str, Any]  # a report.json read back (flash-and-compare's or hybrid's)


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    """The reports' templates (harness/templates, package data), every value HTML-escaped."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("harness", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(template: str, **context: object) -> str:
    """Render one of the report templates (``harness/templates/<template>``)."""
    return _env().get_template(template).render(**context)


# ---- SVG plots --------------------------------------------------------------------------------------


def _timeline(tap: TapResult | None) -> View | None:
    """Geometry of the checksum timeline: one cell per op and comparison (green = same checksum, red =
    differs, dark red = the first)."""
    if tap is None or not tap.runs:
        return None
    found = divergences(tap.runs[0])
    n = max((d.ops_compared for _, d in found), default=0)
    if n == 0:
        return None
    cell, left, top = max(4, min(14, 900 // n)), 150, 18
    rows = []
    for j, (k, d) in enumerate(found):
        bad = set(d.differing_ops)
        cells = [
            {
                "x": left + idx * cell,
                "op": idx,
                "color": "#7f0000" if idx == d.op else ("#e57373" if idx in bad else "#2e9e4f"),
                "state": "differs" if idx in bad else "same",
            }
            for idx in range(n)
        ]
        rows.append({"y": top + j * (cell + 6), "label": k.replace("_", " "), "cells": cells})
    return {
        "width": left + n * cell + 10,
        "height": top + len(found) * (cell + 6) + 24,
        "cell": cell,
        "left": left,
        "rows": rows,
        "ticks": [(left + idx * cell, idx) for idx in range(0, n, 10)],
    }


def _bars(timing: Timing | None) -> View | None:
    """Geometry of the timing bars: per op, optimized and ANSI C time (microseconds)."""
    if not timing or not timing["ops"]:
        return None
    ops = timing["ops"]
    vmax = max((max(r["us"].values() or [0.0]) for r in ops), default=0.0) or 1.0
    bar, left, plot_w = 5, 230, 560
    rows = []
    for k, r in enumerate(ops):
        bars = [
            {
                "j": j,
                "variant": v,
                "color": color,
                "us": r["us"][v],
                "w": max(1.0, plot_w * r["us"][v] / vmax),
            }
            for j, (v, color) in enumerate((("optimized", "#1565c0"), ("ansi", "#9e9e9e")))
            if r["us"].get(v) is not None
        ]
        label = f"{r['op']} {r['opcode']}"
        rows.append({"y": 20 + k * (2 * bar + 3), "label": label, "op": r["op"], "opcode": r["opcode"],
                     "bars": bars, "speedup": r["speedup"]})  # fmt: skip
    return {
        "width": left + plot_w + 90,
        "height": 20 + len(ops) * (2 * bar + 3) + 10,
        "bar": bar,
        "left": left,
        "plot_w": plot_w,
        "rows": rows,
    }


def audit_view(audit: Audit | None) -> View | None:
    """The audit table's rows: op, kind, ESP-NN on this chip (and why not), cycles, speedup, flag."""
    if not audit:
        return None
    rows = []
    for r in audit["rows"]:
        flag = {"ansi_speed": "runs at ANSI C speed", "slower": "slower optimized"}.get(r["flag"] or "", "")
        rows.append({
            "op": r["op"], "kind": r["kind"], "espnn": "yes" if r["espnn"] else f"no: {r['reason']}",
            "cycles_optimized": "-" if r["cycles_optimized"] is None else r["cycles_optimized"],
            "cycles_ansi": "-" if r["cycles_ansi"] is None else r["cycles_ansi"],
            "speedup": f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-", "flag": flag,
        })  # fmt: skip
    band = f"{float(audit['noise_band']):.0%}"
    return {"chip": audit["chip"], "band": band, "kinds": audit["kinds"], "rows": rows}


# ---- images ------------------------------------------------------------------------------------------


def _png(array: np.ndarray, *, diff: bool = False) -> str:
    """A 2-D array as a base64 PNG: values stretched to 0..255 (diff: |d| in red on black)."""
    x = np.asarray(array, dtype=np.float64)
    if diff:
        mag = np.abs(x)
        top = mag.max() or 1.0
        red = (255 * mag / top).astype(np.uint8)
        rgb = np.stack([red, np.zeros_like(red), np.zeros_like(red)], axis=-1)
        img = Image.fromarray(rgb, "RGB")
    else:
        lo, hi = float(x.min()), float(x.max())
        g = np.zeros_like(x) if hi == lo else (x - lo) / (hi - lo)
        img = Image.fromarray((255 * g).astype(np.uint8), "L")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _plane(array: np.ndarray) -> np.ndarray | None:
    """HxW view of an image-shaped tensor (1,H,W,C): channel 0 if C is small, else mean |.| over C."""
    x = np.asarray(array)
    if x.ndim == 4 and x.shape[0] == 1:
        x = x[0]
    if x.ndim == 3 and x.shape[0] > 1 and x.shape[1] > 1:
        return x[..., 0] if x.shape[2] <= 4 else np.abs(x.astype(np.int64)).mean(axis=2)
    if x.ndim == 2 and min(x.shape) > 1:
        return x
    return None


def _triptych(title: str, ref_name: str, ref: np.ndarray, got: np.ndarray) -> View | None:
    """Reference, optimized and difference of one image-shaped tensor: captions and PNG data URIs."""
    pr, pg = _plane(ref), _plane(got)
    if pr is None or pg is None or pr.shape != pg.shape:
        return None
    d = _plane(np.asarray(got).astype(np.int64) - np.asarray(ref).astype(np.int64))
    n_diff = int(np.count_nonzero(np.asarray(got) != np.asarray(ref)))
    figs = [
        (f"{ref_name} (reference)", _png(pr)),
        ("optimized", _png(pg)),
        (f"difference ({n_diff} elements differ)", _png(d if d is not None else pg * 0, diff=True)),
    ]
    return {"title": title, "figs": figs}


# ---- document ---------------------------------------------------------------------------------------


def _output_images(result: FlashAndCompareResult) -> list[View]:
    out: list[View] = []
    comp = result.comparison
    srcs = {s.label: s for s in comp.sources} if comp is not None else {}
    opt = srcs.get("optimized")
    ref = srcs.get("reference") or srcs.get("ansi")
    if opt is None or ref is None:
        return out
    for i, (run_o, run_r) in enumerate(zip(opt.runs, ref.runs, strict=False)):
        for t_o, t_r in zip(run_o, run_r, strict=False):
            a = np.asarray(t_o.values).reshape(t_o.shape or np.shape(t_o.values))
            b = np.asarray(t_r.values).reshape(a.shape) if np.size(t_r.values) == a.size else None
            if b is None:
                continue
            tri = _triptych(f"input {i}, output {t_o.index} {t_o.name}", ref.label, b, a)
            if tri:
                out.append(tri)
    return out


def _devices(doc: ReportDoc) -> list[View]:
    rows = []
    for v, r in (doc.get("variants") or {}).items():
        info = (((r.get("results") or {}).get("sources") or [{}])[0] or {}).get("info", {})
        rows.append({
            "variant": v, "nn_mode": r.get("nn_mode"), "chip": (r.get("flash") or {}).get("chip", "-"),
            "idf": info.get("idf", "-"), "sha": (r.get("firmware_sha256") or "-")[:16],
            "valid": r.get("capture_valid"),
        })  # fmt: skip
    return rows


def _timing_view(timing: Timing | None) -> View | None:
    if not timing:
        return None
    by_type = [
        {"name": k, "count": r["count"], "cells": timing_cells(r["us"], r["speedup"])}
        for k, r in timing["by_type"].items()
    ]
    total = timing_cells(timing["total_us"], timing["speedup"])
    return {"total": total, "by_type": by_type, "bars": _bars(timing)}


def _tap_view(tap: TapResult | None) -> View | None:
    if tap is None:
        return None
    images = [
        _triptych(
            f"op {im['op']} {im['role']}put tensor {im['t']} (dump run)", im["ref_name"], im["ref"], im["got"]
        )
        for im in tap.images
    ]
    return {
        "timeline": _timeline(tap),
        "images": [t for t in images if t is not None],
        "timing": _timing_view(tap.timing),
        "audit": audit_view(tap.audit),
    }


def render_html(result: FlashAndCompareResult, doc: ReportDoc) -> str:
    """The whole report as one HTML string (harness/templates/flash_and_compare.html.j2)."""
    verdict = str(doc.get("verdict"))
    comp = doc.get("comparison") or {}
    comparisons = [{"name": "", **c} for c in comp.get("comparisons") or []]
    view = {
        "verdict": verdict,
        "cls": {"match": "match", "mismatch": "mismatch"}.get(verdict, "other"),
        "devices": _devices(doc),
        "comparisons": comparisons,
        "images": _output_images(result),
        "tap": _tap_view(result.tap),
    }
    return render("flash_and_compare.html.j2", doc=doc, view=view)


def render_hybrid_html(doc: ReportDoc) -> str:
    """The hybrid report as one HTML page (harness/templates/hybrid.html.j2)."""
    verdict = str(doc.get("verdict"))
    view = {
        "cls": "match" if doc.get("offered") else ("mismatch" if verdict == "mismatch" else "other"),
        "head": "HYBRID OFFERED" if doc.get("offered") else "NO HYBRID OFFERED",
        "audit": audit_view(doc.get("audit")),
    }
    return render("hybrid.html.j2", doc=doc, view=view)


# ---- bundle -------------------------------------------------------------------------------------------


def write_bundle(
    result: FlashAndCompareResult,
    doc: ReportDoc,
    model: Path,
    inputs: Sequence[Path],
    dest: Path,
    html_text: str | None,
) -> Path:
    """A zip with everything needed to reproduce the run (no build products, no caches)."""
    out = result.out_dir
    chips = {v: r.get("flash") for v, r in (doc.get("variants") or {}).items()}
    # one directory per position: two inputs of the same file name never collide, and order is kept
    in_arcs = [f"inputs/{k}/{p.name}" for k, p in enumerate(inputs)]
    status = f"verdict: {doc.get('verdict')} (exit {doc.get('exit_code')}), board {doc.get('board')}"
    if doc.get("simulated"):
        status += " (SIMULATED)"
    if doc.get("native"):
        status += " (NATIVE: the firmware built for a PC, generic ESP-NN C kernels, no chip)"
    listing = (
        "model/        the .tflite\ninputs/K/     the K-th input file as given\n"
        "projects/     the rendered firmware projects (sdkconfig.defaults, idf_component.yml /\n"
        "              platformio.ini with the pinned esp-tflite-micro / esp-nn versions, esp-check.json)\n"
        "logs/         raw build, flash (esptool) and serial logs\nchip.json     chip info esptool read\n"
        "report.json   the full report\n"
    )
    if html_text:
        listing += "report.html   the HTML report\n"
    if (out / "repro").is_dir():
        listing += (
            "repro/        the culprit op alone: one-op .tflite, captured input, ANSI C / optimized outputs\n"
        )
    command = " ".join(
        [f"model/{model.name}", *(f"--input {arc}" for arc in in_arcs), f"--board {doc.get('board')}"]
    )
    readme = (
        f"esp-check {__version__} reproduction bundle\n\n{status}\n\n{listing}"
        f"\nreproduce: esp-check flash-and-compare {command}\n"
    )
    head: list[tuple[str, str | Path]] = [("README.txt", readme), (f"model/{model.name}", model)]
    head += [(arc, p) for p, arc in zip(inputs, in_arcs, strict=True)]
    head += [("report.json", json.dumps(doc, indent=2, default=str) + "\n")]
    head += [("chip.json", json.dumps(chips, indent=2, default=str) + "\n")]
    if html_text is not None:
        head.append(("report.html", html_text))
    trees = [("projects", "projects"), ("logs", "logs"), ("tap-dump/logs", "logs/tap-dump"),
             ("tap-dump/projects", "projects/tap-dump"), ("repro", "repro")]  # fmt: skip
    return write_zip(dest, head, out, trees)


BUNDLE_SKIP = frozenset({".pio", "build", "managed_components", "__pycache__"})  # build products, caches


def write_zip(
    dest: Path, head: Sequence[tuple[str, str | Path]], out: Path, trees: Sequence[tuple[str, str]]
) -> Path:
    """A bundle (flash-and-compare's and hybrid's): ``head``'s (name, text or file) in order, then per
    (sub, name) of ``trees`` the file ``out/sub`` as name, or the directory's files, sorted, under name/
    (none inside :data:`BUNDLE_SKIP`); written to ``dest.tmp`` and renamed."""
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for arc, content in head:
                if isinstance(content, Path):
                    z.write(content, arc)
                else:
                    z.writestr(arc, content)
            for sub, arc in trees:
                root = out / sub
                if root.is_file():
                    z.write(root, arc)
                for f in sorted(root.rglob("*")) if root.is_dir() else []:
                    rel = f.relative_to(root)
                    if f.is_file() and not (set(rel.parts) & BUNDLE_SKIP):
                        z.write(f, f"{arc}/{rel.as_posix()}")
        tmp.replace(dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(exc, f"the reproduction bundle {dest}") from None
    return dest


def write_html(path: Path, text: str) -> None:
    """An HTML report on disk, its directory made."""
    write_output(path, text, "HTML report")


def write_outputs(
    result: FlashAndCompareResult,
    *,
    model: Path,
    inputs: Sequence[Path],
    html: str | Path | None = None,
    bundle: str | Path | None = None,
) -> None:
    """Write the HTML report and/or the reproduction bundle for a finished flash-and-compare."""
    doc = json.loads(Path(result.report_path).read_text(encoding="utf-8"))
    text = render_html(result, doc)
    if html is not None:
        write_html(Path(html), text)
    if bundle is not None:
        write_bundle(result, doc, model, inputs, Path(bundle), text)
