"""esp-check's pytest plugin (placeholder, filled in below)."""
