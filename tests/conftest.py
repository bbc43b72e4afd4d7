"""Shared fixtures: the fixture models copied from ../shared/models (provenance in tests/data/models)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
MODELS = DATA / "models"


def pytest_configure(config: pytest.Config) -> None:
    """Board locks of this test run only (each pytest-xdist worker configures its own): the suite's
    simulated boards never wait on another run's, nor take a developer's real bench locks. Caches stay
    shared: builds and references are keyed by content and built under file locks."""
    if "ESP_CHECK_LOCK_DIR" not in os.environ:
        locks = tempfile.mkdtemp(prefix="esp-check-test-locks-")
        os.environ["ESP_CHECK_LOCK_DIR"] = locks
        config.add_cleanup(lambda: shutil.rmtree(locks, ignore_errors=True))


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def have_cc() -> bool:
    return shutil.which("cc") is not None or shutil.which("gcc") is not None


@pytest.fixture
def no_tflm_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked: the tflite-micro wheel's absence (as on macOS/Windows/ARM): no metadata says it is
    installed, and importing it raises ImportError (a module mapped to None in sys.modules)."""
    real_version = importlib.metadata.version

    def version(dist: str) -> str:
        if dist == "tflite-micro":
            raise importlib.metadata.PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setitem(sys.modules, "tflite_micro", None)
    monkeypatch.setitem(sys.modules, "tflite_micro.python.tflite_micro", None)
