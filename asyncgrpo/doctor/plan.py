"""The checks of a host, in order, with what each builds on."""

from __future__ import annotations

from functools import partial

from asyncgrpo.doctor import local, remote
from asyncgrpo.doctor.checks import Check, Result, run_checks
from asyncgrpo.doctor.host import Host

PACKAGES = ("torch", "transformers", "peft", "vllm")


def checks(host: Host) -> list[Check]:
    return [
        Check("server", partial(remote.server, host)),
        Check("token", partial(remote.token, host), ("server",)),
        Check("version", partial(remote.version, host), ("token",)),
        Check("run", partial(remote.run, host), ("token",)),
        Check("bucket", partial(remote.bucket, host), ("token",)),
        Check("device", partial(local.device, host)),
        Check("dtype", partial(local.dtype, host), ("device",)),
        Check("gpu memory", partial(local.gpu_memory, host), ("device",)),
        *(Check(name, partial(local.package, host, name)) for name in PACKAGES),
        Check("model", partial(local.model, host), ("device", "dtype")),
        Check("fingerprint", partial(local.fingerprint, host), ("model", "run")),
    ]


def examine(host: Host) -> list[Result]:
    """Run every check of `host` (its client closed afterwards)."""
    try:
        return run_checks(checks(host))
    finally:
        client = host.found.get("client")
        if client is not None:
            client.close()
