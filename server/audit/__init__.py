"""The audit log (docs/guides/audit.md; docs/architecture/security.md, "The audit log")."""
