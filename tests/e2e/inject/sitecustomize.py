"""Fault injection for reproducing the end-to-end races by hand; the suite never uses it. Put
this folder first on PYTHONPATH (a Cluster passes PYTHONPATH on to every process it starts)
and set:

- INJECT_PUBLISH_DELAY_S=N: the server holds each adapter publish N seconds before handling
  it (and says so on stderr: the server log), so a learner killed meanwhile has its publish land
  after its death (tests/e2e/test_faults.py::test_learner_killed_and_server_restarted).

E2E_INJECT_POLL_GAP_S (read by tests/e2e/test_faults.py itself) widens the gap between seeing
a worker's lease and acting on it.
"""

import os
import sys

_PUBLISH_DELAY_S = float(os.environ.get("INJECT_PUBLISH_DELAY_S") or 0)

if _PUBLISH_DELAY_S and "uvicorn" in sys.orig_argv:
    import time
    from typing import Any

    import server.learner.publish as _publish

    _real_publish = _publish.publish

    def _delayed_publish(*args: Any, **kwargs: Any) -> Any:
        print(f"inject: holding a publish {_PUBLISH_DELAY_S:g} s", file=sys.stderr, flush=True)
        time.sleep(_PUBLISH_DELAY_S)
        return _real_publish(*args, **kwargs)

    _publish.publish = _delayed_publish  # type: ignore[assignment]
