"""CLI commands (placeholder: the owning module fills this in)."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    del group
