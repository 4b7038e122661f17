"""The one test harness of tests/ and bench/ (bench/ imports it; nothing in it needs pytest but
fixtures.py):

- runs.py: THE run-config builder (`run_config` with tiny defaults and layers of overrides)
  and run creation through the API;
- batches.py: batch factories, what acquire + upload + complete leave behind;
- live_app.py: the app served in the test process (its sessionmaker and store at hand), with
  learner processes against it through asyncgrpo.cluster.Cluster;
- stack.py: live stacks on Cluster (server, workers and learner as processes; Postgres or
  SQLite; a bucket folder or S3), the moto process and a migrated throw-away database;
- serve.py: an app served by uvicorn in a thread of the test process, or `asyncgrpo server` as
  a process of its own (for tests that measure that process), and its peak memory;
- s3.py: an S3 endpoint as tests and benchmarks reach one;
- broker.py: the Redis broker URL of the Celery tests, a database per xdist worker;
- owner.py: a command that owns child processes (`asyncgrpo demo`, `asyncgrpo local`) as a
  subprocess, its descendants read from /proc, and the check that Ctrl-C stops them all;
- fixtures.py: the pytest fixtures over them, registered by the conftests that use them.
"""
