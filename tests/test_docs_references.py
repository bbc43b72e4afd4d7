"""The documentation the code points to exists and says what the code does (no stale docs).

Real: the repository's own files. Nothing is faked.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness.firmware.boards import load_board
from harness.firmware.layout import flash_layout

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
_REF = re.compile(r'docs/([a-z_-]+\.md),? "([^"\n]+)"')


def _headings(doc: Path) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"(?m)^#{1,6} (.+)$", doc.read_text(encoding="utf-8"))}


def test_every_docs_section_the_code_names_exists() -> None:
    """`docs/firmware.md "Flash layout"` in a comment, a template or a doc names a heading of that file (the
    partitions.csv template and layout.py named a "Flash layout" section docs/firmware.md did not have).
    Checked for the firmware and simulator docs (the other docs are not held to it yet)."""
    missing = []
    for path in [*ROOT.joinpath("harness").rglob("*.py"), *ROOT.joinpath("firmware_templates").rglob("*"),
                 *DOCS.glob("*.md"), ROOT / "README.md"]:  # fmt: skip
        if not path.is_file():
            continue
        for m in _REF.finditer(path.read_text(encoding="utf-8", errors="replace")):
            doc = DOCS / m.group(1)
            if doc.name not in ("firmware.md", "simulator.md"):
                continue
            if not doc.is_file() or not any(m.group(2).lower() in h.lower() for h in _headings(doc)):
                missing.append(f'{path.relative_to(ROOT)}: docs/{m.group(1)} "{m.group(2)}"')
    assert not missing, missing


def _section(doc: Path, heading: str) -> str:
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_simulator_doc_boots_the_layout_the_sim_builder_packs() -> None:
    """docs/simulator.md "Booting an image" gives the simulated board's partitions where the layout puts
    them (it described the old single app at 0x10000), and says the sim builder packs otadata."""
    text = _section(DOCS / "simulator.md", "Booting an image")
    layout = flash_layout(load_board("sim"))
    for row in layout.rows:
        if row.name == "nvs":
            continue
        assert re.search(rf"{row.name}`?[^,;]*\sat\s0x{row.offset:x}\b", text), (row.name, hex(row.offset))
    assert f"table at 0x{layout.table_offset:x}" in text and "`ota_data_initial.bin` at otadata" in text
    assert "`esp-check-sim.bin` at 0x10000" not in text


def test_firmware_doc_describes_the_current_partition_table() -> None:
    """docs/firmware.md no longer describes the old single factory app, nor a sim build without otadata."""
    text = (DOCS / "firmware.md").read_text(encoding="utf-8")
    assert "factory app partition" not in text
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("| `ota_data/ota_data_initial.bin`"))
    assert not row.rstrip().endswith("| - |")  # the sim builder packs otadata too
    assert "## Flash layout" in text


def test_architecture_lists_every_module() -> None:
    """docs/architecture.md, "Every module": a reader finds each module of harness/ there (one line each)."""
    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(harness[a-z0-9_.]*)` \| (\S.*?) \|$", doc, re.M))
    names = {m for m, _ in listed}
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for p in (root / "harness").rglob("*.py")
    }
    assert modules - names == set(), "add these to docs/architecture.md, 'Every module'"
    assert names - modules == set(), "these are listed but do not exist"


def test_simulator_doc_describes_every_fault() -> None:
    """docs/simulator.md's Faults table is the one description of each fault harness.sim.faults.FAULTS
    accepts (frame_rx, frame_tx, stall and flaky had a row nowhere but in the code)."""
    from harness.sim.faults import FAULTS

    text = (DOCS / "simulator.md").read_text(encoding="utf-8")
    table = text[text.index("## Faults") : text.index("### Hybrid dispatch")]
    rows = set(re.findall(r"^\| `([a-z_]+)`", table, re.M))
    assert set(FAULTS) - rows == set(), "add a row for these to docs/simulator.md, Faults"


_DOTTED = re.compile(
    r"`((?:harness\.)?(?:analysis|device|firmware|flashfmt|flows|model|protocol|runner|sim)\.[a-z_]+(?:\.[A-Za-z_]+)*)`"
)


def test_the_names_docs_give_for_the_code_exist() -> None:
    """Every `package.module.Name` docs/architecture.md names, and every `harness.*` name of the other pages,
    exists (a name that moved or went, e.g. a model a module no longer re-exports, fails here)."""
    import importlib

    missing = []
    for page in sorted(DOCS.glob("*.md")):
        names = set(_DOTTED.findall(page.read_text(encoding="utf-8")))
        if page.name != "architecture.md":  # elsewhere `analysis.rows` may be a report.json field
            names = {n for n in names if n.startswith("harness.")}
        for name in sorted(names):
            parts = (name if name.startswith("harness.") else f"harness.{name}").split(".")
            k = next(k for k in range(len(parts), 1, -1) if _importable(".".join(parts[:k])))
            obj: object = importlib.import_module(".".join(parts[:k]))
            for attr in parts[k:]:
                if not hasattr(obj, attr):
                    missing.append(f"{page.name}: {name}")
                    break
                obj = getattr(obj, attr)
    assert not missing, "the docs name what the code does not have:\n" + "\n".join(missing)


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
