"""harness.device.serialpkg on site directories built from the real installed distributions.

The fixtures are what pip wrote: this venv's ``serial/`` package and the ``*.dist-info`` (RECORD
hashes) of pyserial and pyserial-labgrid, copied into a temporary site directory and then damaged
the way an uninstall or a hand edit damages them.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

import pytest

from harness.device.serialpkg import inspect_serial_package


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    serial_dir = Path(__import__("serial").__file__).parent
    shutil.copytree(serial_dir, site / "serial", ignore=shutil.ignore_patterns("__pycache__"))
    copied = 0
    for name in ("pyserial", "pyserial-labgrid"):
        for dist in metadata.distributions(name=name):
            info = Path(
                str(dist.locate_file(f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"))
            )
            if info.is_dir():
                shutil.copytree(info, site / info.name)
                copied += 1
    if copied == 0:
        pytest.skip("no pyserial dist-info to copy")
    return site


def test_the_provider_is_the_distribution_whose_files_are_on_disk(tmp_path: Path):
    site = _site(tmp_path)
    pkg = inspect_serial_package([str(site)])
    assert pkg.ok and pkg.provider in pkg.installed, pkg.to_dict()
    assert pkg.to_dict()["fix"] is None
    assert f"files of {pkg.provider}" in pkg.describe()


def test_an_uninstall_of_the_other_distribution_is_named_with_its_repair(tmp_path: Path):
    site = _site(tmp_path)
    shutil.rmtree(site / "serial" / "urlhandler")  # what `pip uninstall` of one of the two leaves
    pkg = inspect_serial_package([str(site)])
    assert not pkg.ok and "serial/urlhandler/protocol_rfc2217.py" in pkg.missing
    assert "broken" in pkg.describe() and pkg.fix().startswith(
        "pip install --force-reinstall --no-deps pyserial"
    )


def test_a_file_from_neither_distribution_is_reported(tmp_path: Path):
    site = _site(tmp_path)
    (site / "serial" / "rfc2217.py").write_text("# edited by hand\n")
    pkg = inspect_serial_package([str(site)])
    assert pkg.ok and pkg.provider is None
    assert any(m.startswith("serial/rfc2217.py: neither") for m in pkg.mixed), pkg.mixed


def test_no_distribution_at_all(tmp_path: Path):
    pkg = inspect_serial_package([str(tmp_path)])
    assert not pkg.ok and pkg.describe() == "no pyserial distribution is installed"


def test_the_fork_alone_is_refused_with_the_repair_that_satisfies_pip_check(tmp_path: Path):
    """pyserial uninstalled, the fork's files whole again: `pip check` still says esptool needs pyserial."""
    site = _site(tmp_path)
    infos = list(site.glob("pyserial-*.dist-info"))
    if not infos or not list(site.glob("pyserial_labgrid-*.dist-info")):
        pytest.skip("needs both pyserial and pyserial-labgrid installed")
    shutil.rmtree(infos[0])  # `pip uninstall pyserial` removes its record; the files are the fork's
    pkg = inspect_serial_package([str(site)])
    assert set(pkg.installed) == {"pyserial-labgrid"} and not pkg.missing
    assert not pkg.ok and pkg.unmet == ["pyserial"], pkg.to_dict()
    assert "pip check" in pkg.describe()
    assert pkg.fix() == (
        "pip install --no-deps pyserial && pip install --force-reinstall --no-deps pyserial-labgrid"
    )
    assert pkg.to_dict()["fix"] == pkg.fix()
