"""Command modules: one per area, each with ``register(group)``; commands return an exit code."""
