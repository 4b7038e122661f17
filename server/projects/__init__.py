"""Projects: several teams on one control plane (docs/guides/projects.md)."""
