"""The host checks of `asyncgrpo doctor` (docs/architecture/protocol.md, "Host checks")."""
