"""esp-check: compare ESP-NN optimized and ANSI C TFLite Micro runs on ESP32 against the host reference.

Public Python API lives in :mod:`harness.api`; the CLI (:mod:`harness.cli`) is a thin layer over it.
"""

__version__ = "0.1.0"
