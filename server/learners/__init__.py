"""Pool learners (docs/guides/pool-learners.md): learners that start without a run, register
once with a registration token and take runs that need a learner, as workers take leases."""
