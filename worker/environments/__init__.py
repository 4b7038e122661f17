"""Environments on the worker: rollouts as token-exact trajectories
(docs/architecture/environments.md, "Environments and trajectories"). `registry.make_environment`
builds a run's environment."""
