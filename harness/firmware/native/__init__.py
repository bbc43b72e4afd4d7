"""The native target: the generated firmware built for the PC with the ESP-IDF stand-ins (docs/native.md)."""
