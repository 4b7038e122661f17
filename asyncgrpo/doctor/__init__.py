"""`asyncgrpo doctor worker|learner`: check a host before it joins (docs/guides/real-run.md,
"Check a host before it joins")."""
