"""Shared fixtures: the fixture models copied from ../shared/models (provenance in tests/data/models)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
MODELS = DATA / "models"


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def have_cc() -> bool:
    return shutil.which("cc") is not None or shutil.which("gcc") is not None
