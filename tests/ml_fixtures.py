"""Small-model fixtures (owned by the format/model work)."""
