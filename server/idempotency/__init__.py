"""Safe retries: the answers of state-changing calls made under an Idempotency-Key, stored in
the transaction of their change and replayed to a repeat of the key (docs/architecture/
protocol.md, "Safe retries")."""
