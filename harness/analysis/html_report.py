"""``--html FILE`` and ``--bundle FILE.zip`` for ``flash-and-compare``.

The HTML report is one self-contained file: no scripts, no external assets. Plots are inline SVG
generated here; image-shaped tensors (e.g. a segmentation mask) are embedded PNGs (Pillow, base64
``data:`` URIs) showing reference, optimized and their difference side by side. Every string that
came from a model, a device or a path is HTML-escaped.

The bundle is what upstream maintainers ask for in a bug report: model, inputs, rendered projects
(sdkconfig.defaults, idf_component.yml / platformio.ini with the pinned component versions), chip
info from esptool, raw build/flash/serial logs and the reports.
"""

# ruff: noqa: E501  (inline CSS and HTML table markup read better unwrapped)
from __future__ import annotations

import base64
import html
import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde}
.verdict{display:inline-block;padding:6px 14px;border-radius:6px;font-weight:700;color:#fff;font-size:18px}
.match{background:#1b8a3a}.mismatch{background:#c62828}.other{background:#b26a00}
.sim{background:#fff3cd;border:1px solid #e0c060;padding:6px 10px;border-radius:4px;margin:10px 0}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border:1px solid #ccd;padding:3px 8px;text-align:left}
th{background:#f1f3f8}td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#c62828;font-weight:600}.good{color:#1b8a3a}.culprit{background:#fdecea;border-left:4px solid #c62828;
padding:8px 12px;margin:8px 0}.imgs{display:flex;gap:18px;flex-wrap:wrap}.imgs figure{margin:0}
.imgs img{image-rendering:pixelated;border:1px solid #99a;width:192px;height:192px}
figcaption{font-size:12px;text-align:center;color:#445}code{font-size:12px}
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


# ---- SVG plots --------------------------------------------------------------------------------------


def checksum_timeline_svg(tap: Any) -> str:
    """One cell per op and comparison: green = same checksum, red = differs, dark red = first."""
    if tap is None or not tap.runs:
        return ""
    row = tap.runs[0]
    keys = [k for k in ("optimized_vs_ansi", "optimized_vs_host", "ansi_vs_host") if k in row]
    n = max((row[k].ops_compared for k in keys), default=0)
    if n == 0:
        return ""
    cell, left, top = max(4, min(14, 900 // n)), 150, 18
    width = left + n * cell + 10
    height = top + len(keys) * (cell + 6) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for j, k in enumerate(keys):
        d = row[k]
        y = top + j * (cell + 6)
        parts.append(f'<text x="0" y="{y + cell - 2}" font-size="12">{_e(k.replace("_", " "))}</text>')
        bad = set(d.differing_ops)
        for idx in range(n):
            color = "#2e9e4f"
            if idx == d.op:
                color = "#7f0000"
            elif idx in bad:
                color = "#e57373"
            parts.append(
                f'<rect x="{left + idx * cell}" y="{y}" width="{cell - 1}" height="{cell}" fill="{color}">'
                f"<title>op {idx}: {'differs' if idx in bad else 'same'}</title></rect>"
            )
    for idx in range(0, n, 10):
        x = left + idx * cell
        parts.append(f'<text x="{x}" y="{height - 4}" font-size="10">{idx}</text>')
    parts.append(f'<text x="{left}" y="11" font-size="11">op index (execution order) &#8594;</text></svg>')
    return "".join(parts)


def timing_bars_svg(timing: dict[str, Any] | None) -> str:
    """Horizontal bars per op: optimized and ANSI C time (microseconds)."""
    if not timing or not timing.get("ops"):
        return ""
    ops = timing["ops"]
    vmax = max((max(r["us"].values() or [0.0]) for r in ops), default=0.0) or 1.0
    bar, left, plot_w = 5, 230, 560
    height = 20 + len(ops) * (2 * bar + 3) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + plot_w + 90}" height="{height}">']
    parts.append('<rect x="0" y="0" width="10" height="8" fill="#1565c0"/>')
    parts.append('<text x="14" y="8" font-size="11">optimized</text>')
    parts.append('<rect x="90" y="0" width="10" height="8" fill="#9e9e9e"/>')
    parts.append('<text x="104" y="8" font-size="11">ANSI C</text>')
    for k, r in enumerate(ops):
        y = 20 + k * (2 * bar + 3)
        label = f"{r['op']} {r['opcode']}"
        parts.append(f'<text x="0" y="{y + 2 * bar}" font-size="9">{_e(label)}</text>')
        for j, (v, color) in enumerate((("optimized", "#1565c0"), ("ansi", "#9e9e9e"))):
            us = r["us"].get(v)
            if us is None:
                continue
            w = max(1.0, plot_w * us / vmax)
            parts.append(
                f'<rect x="{left}" y="{y + j * bar}" width="{w:.1f}" height="{bar}" fill="{color}">'
                f"<title>op {r['op']} {_e(r['opcode'])} {v}: {us:.1f} us</title></rect>"
            )
        sp = r.get("speedup")
        if sp:
            parts.append(f'<text x="{left + plot_w + 6}" y="{y + 2 * bar}" font-size="9">{sp:.2f}x</text>')
    parts.append("</svg>")
    return "".join(parts)


def audit_html(audit: Mapping[str, Any] | None) -> str:
    """The audit table: op, kind, ESP-NN on this chip (and why not), cycles of both builds, speedup."""
    if not audit:
        return ""
    band = float(audit.get("noise_band", 0.1))
    h = [
        "<h2>ESP-NN speedup audit</h2>",
        f"<p>chip {_e(audit.get('chip'))}; an op ESP-NN should accelerate whose speedup is within "
        f"1 &plusmn; {band:.0%} runs at ANSI C speed; below 1 &minus; {band:.0%} it is slower optimized.</p>",
    ]
    for k in audit.get("kinds") or []:
        h.append(f"<div class='culprit'><b>{_e(k['message'])}</b></div>")
    h.append(
        "<table><tr><th>op</th><th>kind</th><th>ESP-NN on this chip</th><th>cycles optimized</th>"
        "<th>cycles ANSI C</th><th>speedup</th><th>flag</th></tr>"
    )
    for r in audit.get("rows") or []:
        espnn = "yes" if r["espnn"] else f"no: {r['reason']}"
        sp = f"{r['speedup']:.2f}x" if r.get("speedup") is not None else "-"
        flag = {"ansi_speed": "runs at ANSI C speed", "slower": "slower optimized"}.get(r.get("flag") or "", "")
        cls = " class='bad'" if flag else ""
        h.append(
            f"<tr{cls}><td class='num'>{_e(r['op'])}</td><td>{_e(r['kind'])}</td><td>{_e(espnn)}</td>"
            f"<td class='num'>{_e(r.get('cycles_optimized') if r.get('cycles_optimized') is not None else '-')}</td>"
            f"<td class='num'>{_e(r.get('cycles_ansi') if r.get('cycles_ansi') is not None else '-')}</td>"
            f"<td class='num'>{_e(sp)}</td><td>{_e(flag)}</td></tr>"
        )
    h.append("</table>")
    return "\n".join(h)



# ---- images ------------------------------------------------------------------------------------------


def _png(a: np.ndarray, *, diff: bool = False) -> str:
    """A 2-D array as a base64 PNG: values stretched to 0..255 (diff: |d| in red on black)."""
    from PIL import Image

    x = np.asarray(a, dtype=np.float64)
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


def _plane(a: np.ndarray) -> np.ndarray | None:
    """HxW view of an image-shaped tensor (1,H,W,C): channel 0 if C is small, else mean |.| over C."""
    x = np.asarray(a)
    if x.ndim == 4 and x.shape[0] == 1:
        x = x[0]
    if x.ndim == 3 and x.shape[0] > 1 and x.shape[1] > 1:
        return x[..., 0] if x.shape[2] <= 4 else np.abs(x.astype(np.int64)).mean(axis=2)
    if x.ndim == 2 and min(x.shape) > 1:
        return x
    return None


def image_triptych(title: str, ref_name: str, ref: np.ndarray, got: np.ndarray) -> str:
    """Reference, optimized and difference of one image-shaped tensor, side by side."""
    pr, pg = _plane(ref), _plane(got)
    if pr is None or pg is None or pr.shape != pg.shape:
        return ""
    d = _plane(np.asarray(got).astype(np.int64) - np.asarray(ref).astype(np.int64))
    n_diff = int(np.count_nonzero(np.asarray(got) != np.asarray(ref)))
    figs = [
        (f"{ref_name} (reference)", _png(pr)),
        ("optimized", _png(pg)),
        (f"difference ({n_diff} elements differ)", _png(d if d is not None else pg * 0, diff=True)),
    ]
    inner = "".join(
        f'<figure><img alt="{_e(c)}" src="{src}"><figcaption>{_e(c)}</figcaption></figure>' for c, src in figs
    )
    return f"<h3>{_e(title)}</h3><div class='imgs'>{inner}</div>"


# ---- document ---------------------------------------------------------------------------------------


def _output_images(result: Any) -> list[str]:
    out: list[str] = []
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
            tri = image_triptych(f"input {i}, output {t_o.index} {t_o.name}", ref.label, b, a)
            if tri:
                out.append(tri)
    return out


def render_html(result: Any, doc: dict[str, Any]) -> str:
    """The whole report as one HTML string."""
    verdict = str(doc.get("verdict"))
    cls = {"match": "match", "mismatch": "mismatch"}.get(verdict, "other")
    h: list[str] = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>esp-check: {_e(verdict)}</title><style>{_CSS}</style></head><body>",
        "<h1>esp-check flash-and-compare</h1>",
        f"<div><span class='verdict {cls}'>{_e(verdict.upper())}</span> exit code {_e(doc.get('exit_code'))}"
        f" &middot; board {_e(doc.get('board'))} &middot; model <code>{_e(doc.get('model'))}</code></div>",
    ]
    if doc.get("simulated"):
        h.append("<div class='sim'>SIMULATED BOARD: no real ESP32 was used for these results.</div>")
    if doc.get("native"):
        h.append(f"<div class='sim'>{_e(doc['native'].get('meaning', 'NATIVE'))}</div>")
    for err in doc.get("errors") or []:
        h.append(f"<div class='bad'>error: {_e(err)}</div>")
    # device identity
    h.append("<h2>Devices</h2><table><tr><th>variant</th><th>ESP-NN mode (reported)</th><th>chip</th>"
             "<th>IDF</th><th>firmware sha256</th><th>capture</th></tr>")  # fmt: skip
    for v, r in (doc.get("variants") or {}).items():
        chip = (r.get("flash") or {}).get("chip", "-")
        info = (((r.get("results") or {}).get("sources") or [{}])[0] or {}).get("info", {})
        h.append(
            f"<tr><td>{_e(v)}</td><td>{_e(r.get('nn_mode'))}</td><td>{_e(chip)}</td>"
            f"<td>{_e(info.get('idf', '-'))}</td><td><code>{_e((r.get('firmware_sha256') or '-')[:16])}"
            f"</code></td><td>{'valid' if r.get('capture_valid') else 'NOT valid'}</td></tr>"
        )
    h.append("</table>")
    # per-output comparison
    comp = doc.get("comparison") or {}
    rows = comp.get("comparisons") or []
    if rows:
        h.append("<h2>Per-output comparison</h2><table><tr><th>a</th><th>b</th><th>input</th><th>output</th>"
                 "<th>verdict</th><th>mismatched</th><th>of</th><th>max diff (LSB)</th><th>mean diff (LSB)</th></tr>")  # fmt: skip
        for c in rows:
            ok = c.get("verdict") == "match"
            h.append(
                f"<tr><td>{_e(c.get('a'))}</td><td>{_e(c.get('b'))}</td><td class='num'>{_e(c.get('run'))}</td>"
                f"<td>{_e(c.get('output'))} {_e(c.get('name', ''))}</td>"
                f"<td class='{'good' if ok else 'bad'}'>{_e(c.get('verdict'))}</td>"
                f"<td class='num'>{_e(c.get('mismatched'))}</td><td class='num'>{_e(c.get('count'))}</td>"
                f"<td class='num'>{_e(c.get('max_diff_lsb'))}</td>"
                f"<td class='num'>{float(c.get('mean_diff_lsb') or 0):.4f}</td></tr>"
            )
        h.append("</table>")
    imgs = _output_images(result)
    if imgs:
        h.append("<h2>Outputs as images</h2>" + "".join(imgs))
    tap = getattr(result, "tap", None)
    tdoc = doc.get("tap")
    if tap is not None and tdoc is not None:
        h.append("<h2>Per-op checksums (--tap)</h2>")
        cul = tdoc.get("culprit")
        if cul:
            h.append(f"<div class='culprit'><b>{_e(cul['message'])}</b></div>")
        else:
            h.append("<div class='good'>optimized, ANSI C and host agree on every op checksum.</div>")
        h.append(checksum_timeline_svg(tap))
        h.append("<ul>" + "".join(f"<li>{_e(s)}</li>" for s in tdoc.get("summary", [])) + "</ul>")
        if tdoc.get("ram_bytes"):
            ram = ", ".join(f"{v}: {n} bytes" for v, n in tdoc["ram_bytes"].items())
            h.append(f"<p>tap RAM on the device (records + dump buffer): {_e(ram)}</p>")
        for im in tap.images:
            h.append(image_triptych(
                f"op {im['op']} {im['role']}put tensor {im['t']} (dump run)", im["ref_name"], im["ref"], im["got"]
            ))  # fmt: skip
        timing = tdoc.get("timing")
        if timing:
            h.append("<h2>Per-op timing</h2>")
            sp = timing.get("speedup")
            tot = timing.get("total_us", {})
            h.append(
                f"<p>total: optimized {tot.get('optimized', 0):.0f} us, ANSI C {tot.get('ansi', 0):.0f} us"
                + (f", speedup {sp:.2f}x" if sp else "")
                + "</p>"
            )
            h.append("<table><tr><th>op type</th><th>count</th><th>optimized us</th><th>ANSI C us</th>"
                     "<th>speedup</th></tr>")  # fmt: skip
            for name, r in timing["by_type"].items():
                s2 = r.get("speedup")
                h.append(
                    f"<tr><td>{_e(name)}</td><td class='num'>{r['count']}</td>"
                    f"<td class='num'>{r['us'].get('optimized', 0):.1f}</td>"
                    f"<td class='num'>{r['us'].get('ansi', 0):.1f}</td>"
                    f"<td class='num'>{f'{s2:.2f}x' if s2 else '-'}</td></tr>"
                )
            h.append("</table>")
            h.append(timing_bars_svg(timing))
        h.append(audit_html(tdoc.get("audit")))
    h.append("<h2>Stages</h2><table><tr><th>stage</th><th>variant</th><th>status</th><th>seconds</th>"
             "<th>detail</th></tr>")  # fmt: skip
    for s in doc.get("stages") or []:
        h.append(
            f"<tr><td>{_e(s['stage'])}</td><td>{_e(s.get('variant') or '-')}</td><td>{_e(s['status'])}</td>"
            f"<td class='num'>{s['seconds']}</td><td>{_e(s.get('detail', ''))[:300]}</td></tr>"
        )
    h.append(f"</table><p><small>esp-check {_e(doc.get('tool_version'))}</small></p></body></html>\n")
    return "\n".join(h)


# ---- bundle -------------------------------------------------------------------------------------------


def write_bundle(result: Any, doc: dict[str, Any], model: Path, inputs: Sequence[Path], dest: Path,
                 html_text: str | None) -> Path:  # fmt: skip
    """A zip with everything needed to reproduce the run (no build products, no caches)."""
    from harness import __version__

    out = result.out_dir
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    chips = {v: r.get("flash") for v, r in (doc.get("variants") or {}).items()}
    # one directory per position: two inputs of the same file name never collide, and order is kept
    in_arcs = [f"inputs/{k}/{p.name}" for k, p in enumerate(inputs)]
    readme = (
        f"esp-check {__version__} reproduction bundle\n\nverdict: {doc.get('verdict')} "
        f"(exit {doc.get('exit_code')}), board {doc.get('board')}"
        + (" (SIMULATED)" if doc.get("simulated") else "")
        + (" (NATIVE: the firmware built for a PC, generic ESP-NN C kernels, no chip)" if doc.get("native") else "")
        + "\n\nmodel/        the .tflite\ninputs/K/     the K-th input file as given\n"
        "projects/     the rendered firmware projects (sdkconfig.defaults, idf_component.yml /\n"
        "              platformio.ini with the pinned esp-tflite-micro / esp-nn versions, esp-check.json)\n"
        "logs/         raw build, flash (esptool) and serial logs\nchip.json     chip info esptool read\n"
        "report.json   the full report" + ("\nreport.html   the HTML report" if html_text else "") + "\n"
        + ("repro/        the culprit op alone: one-op .tflite, captured input, ANSI C / optimized outputs\n"
           if (out / "repro").is_dir() else "")
        + "\nreproduce: esp-check flash-and-compare "
        + " ".join([f"model/{model.name}", *(f"--input {arc}" for arc in in_arcs), f"--board {doc.get('board')}"])
        + "\n"
    )
    skip_dirs = {".pio", "build", "managed_components", "__pycache__"}
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("README.txt", readme)
        z.write(model, f"model/{model.name}")
        for p, arc in zip(inputs, in_arcs, strict=True):
            z.write(p, arc)
        z.writestr("report.json", json.dumps(doc, indent=2, default=str) + "\n")
        z.writestr("chip.json", json.dumps(chips, indent=2, default=str) + "\n")
        if html_text is not None:
            z.writestr("report.html", html_text)
        for sub, arc in (("projects", "projects"), ("logs", "logs"), ("tap-dump/logs", "logs/tap-dump"),
                         ("tap-dump/projects", "projects/tap-dump"), ("repro", "repro")):  # fmt: skip
            root = out / sub
            if not root.is_dir():
                continue
            for f in sorted(root.rglob("*")):
                rel = f.relative_to(root)
                if f.is_file() and not (set(rel.parts) & skip_dirs):
                    z.write(f, f"{arc}/{rel.as_posix()}")
    tmp.replace(dest)
    return dest


def write_outputs(
    result: Any,
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
        path = Path(html)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if bundle is not None:
        write_bundle(result, doc, model, inputs, Path(bundle), text)
