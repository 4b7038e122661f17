"""The one test harness of tests/ and bench/: run configs (runs.py), batch factories
(batches.py), live stacks on asyncgrpo.cluster.Cluster or an in-thread app (stack.py) and the
pytest fixtures over them (fixtures.py, registered by the conftests that use them)."""
