"""Command modules, one per area; each command returns an exit code. ``harness.cli.LAZY_COMMANDS`` names
every command's module, imported only when that command runs."""
