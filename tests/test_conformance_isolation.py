"""The real client packages are installed (the `test` extra) but stay out of this project's own run.

pytest-embedded registers a `pytest11` entry point, so once installed it would load into every pytest
run: its options, fixtures and hooks would join ours. pyproject's addopts block it (`-p no:pytest_embedded`);
the conformance tests run it in a pytest subprocess of their own.
"""

from __future__ import annotations

import importlib.metadata

import pytest


def test_pytest_embedded_is_installed_but_not_loaded_here(pytestconfig: pytest.Config) -> None:
    entry_points = importlib.metadata.entry_points(group="pytest11")
    names = {ep.name for ep in entry_points}
    if "pytest_embedded" not in names:
        pytest.skip("pytest-embedded is not installed (pip install -e '.[test]')")
    assert not pytestconfig.pluginmanager.has_plugin("pytest_embedded")
    assert pytestconfig.pluginmanager.is_blocked("pytest_embedded")
    # the only pytest11 plugins of the environment that load here are the ones this suite expects
    # (esp_check: this package's own plugin, inert unless used: tests/test_pytest_plugin.py)
    loaded = {n for n in names if pytestconfig.pluginmanager.has_plugin(n)}
    # (xdist: pytest-xdist, which the README's test command runs the suite on)
    assert loaded <= {"hypothesispytest", "anyio", "esp_check", "xdist", "xdist.looponfail"}, loaded
    if "labgrid" in names:  # installed with the test extra on Linux (tests/test_labgrid_e2e.py)
        assert pytestconfig.pluginmanager.is_blocked("labgrid")
