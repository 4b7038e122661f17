"""Local-folder object store (implementation in progress)."""
