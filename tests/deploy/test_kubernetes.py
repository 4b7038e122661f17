"""deploy/kubernetes, offline: every object passes `kubernetes-validate --strict` against a
pinned Kubernetes release, the kustomization lists every manifest and renders (with kubectl's
built-in kustomize when it is installed), and the deployment's promises hold: one beat, the
jobs off the server, workers keeping their token on a per-pod volume and given time to release
their leases on SIGTERM. Not run on a cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.manifests import (
    ADAPTER_RULES,
    KUBERNETES_VERSION,
    KUSTOMIZE,
    all_objects,
    containers,
    documents,
    resources,
)
from worker.config import WorkerSettings


def _by_kind(kind: str, name: str) -> dict[str, Any]:
    return next(o for o in all_objects() if o["kind"] == kind and o["metadata"]["name"] == name)


def test_kustomization_lists_every_manifest() -> None:
    listed = {p.name for p in resources()}
    on_disk = {p.name for p in KUSTOMIZE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("path", [*resources(), ADAPTER_RULES], ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path) -> None:  # type: ignore[no-untyped-def]
    for obj in documents(path):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    """The check can fail: a misspelt field is an error, not silently dropped."""
    job = _by_kind("Job", "asyncgrpo-migrate")
    job["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


@pytest.mark.integration  # runs kubectl
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (built-in kustomize) absent")
def test_kustomize_renders_valid_objects() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZE)], capture_output=True, text=True, check=True
    ).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    assert len(objects) == len(list(all_objects()))
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "asyncgrpo"


def test_control_plane_shape() -> None:
    settings = _by_kind("ConfigMap", "asyncgrpo-settings")["data"]
    assert settings["ASYNCGRPO_JOBS__MODE"] == "celery"  # several server replicas
    assert _by_kind("Deployment", "asyncgrpo-server")["spec"]["replicas"] >= 2
    beat = _by_kind("Deployment", "asyncgrpo-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert "--beat-only" in containers(beat)[0]["command"]
    assert "--no-beat" in containers(_by_kind("Deployment", "asyncgrpo-jobs"))[0]["command"]
    migrate = containers(_by_kind("Job", "asyncgrpo-migrate"))[0]["command"]
    assert migrate == ["asyncgrpo", "db", "upgrade"]


def test_cli_commands_of_the_manifests_exist() -> None:
    """Every `asyncgrpo …` command line in the manifests parses with the real CLI."""
    from typer.main import get_command

    from asyncgrpo.cli import app

    group: Any = get_command(app)
    for obj in all_objects():
        for container in containers(obj):
            argv = container.get("command")
            if not argv or argv[0] != "asyncgrpo":
                continue
            command = group
            args = argv[1:]
            while hasattr(command, "commands") and args and args[0] in command.commands:
                command, args = command.commands[args[0]], args[1:]
            ctx = command.make_context("asyncgrpo", list(args), resilient_parsing=False)
            assert ctx.params is not None


def test_workers_keep_their_token_and_release_on_sigterm() -> None:
    sts = _by_kind("StatefulSet", "asyncgrpo-worker")
    pod = sts["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    env = _by_kind("ConfigMap", "asyncgrpo-worker-settings")["data"]
    token_file = env["ASYNCGRPO_WORKER_TOKEN_FILE"]
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    state = [n for n in claims if token_file.startswith(mounts[n] + "/")]
    assert state, "the token file must be on a volumeClaimTemplates volume"
    registration = next(e for e in worker["env"] if e["name"].endswith("REGISTRATION_TOKEN"))
    assert "secretKeyRef" in registration["valueFrom"]
    # SIGTERM: the worker exits within shutdown_grace_s + ~2 s (worker/main.py); the pod's grace
    # must cover it with room for a slow release.
    grace = float(env["ASYNCGRPO_WORKER_SHUTDOWN_GRACE_S"])
    assert grace + 2 + 5 <= pod["terminationGracePeriodSeconds"] <= 30
    assert "kill -TERM 1" in " ".join(worker["lifecycle"]["preStop"]["exec"]["command"])
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    assert WorkerSettings.model_fields["shutdown_grace_s"].default < grace


def test_hpa_scales_the_worker_statefulset_on_the_admissible_work_metric() -> None:
    hpa = _by_kind("HorizontalPodAutoscaler", "asyncgrpo-worker")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "asyncgrpo-worker",
    }
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    rules = yaml.safe_load(documents(ADAPTER_RULES)[0]["data"]["config.yaml"])["externalRules"]
    rule = rules[0]
    assert rule["name"]["as"] == metric["name"]
    assert "asyncgrpo_admissible_groups" in rule["metricsQuery"]
    assert "asyncgrpo_model_groups_in_flight" in rule["metricsQuery"]
    from server.metrics.service import model_label

    model = _by_kind("ConfigMap", "asyncgrpo-worker-settings")["data"]["ASYNCGRPO_WORKER_MODEL"]
    assert metric["selector"]["matchLabels"]["model_label"] == model_label(model)


CLI = Path(sys.executable).parent / "kubernetes-validate"  # the package's console script


def _cli(*paths: Path) -> subprocess.CompletedProcess[str]:
    """The `kubernetes-validate` command itself, as the issue and docs/guides/fleet.md name it."""
    argv = [str(CLI), "--strict", "-k", KUBERNETES_VERSION, *map(str, paths)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.mark.integration  # runs kubernetes-validate
def test_kubernetes_validate_cli_strict_passes_every_object() -> None:
    """Every object `passed`, none only warned about: the CLI merely warns (exit 0) on a kind it
    has no schema for, so a misspelt apiVersion must show up as a missing `passed` line."""
    paths = [*resources(), ADAPTER_RULES]
    result = _cli(*paths)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "WARN" not in out and "ERROR" not in out, out
    objects = sum(len(documents(p)) for p in paths)
    assert out.count(" passed for resource ") == objects


@pytest.mark.integration  # runs kubernetes-validate
def test_kubernetes_validate_cli_fails_a_broken_manifest(tmp_path: Path) -> None:
    sts = _by_kind("StatefulSet", "asyncgrpo-worker")
    sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "twenty"
    bad = tmp_path / "worker-statefulset.yaml"
    bad.write_text(yaml.safe_dump(sts))
    result = _cli(bad)
    assert result.returncode != 0 and "terminationGracePeriodSeconds" in result.stdout


def test_a_wrong_api_version_is_refused() -> None:
    hpa = _by_kind("HorizontalPodAutoscaler", "asyncgrpo-worker")
    hpa["apiVersion"] = "autoscaling/v3"
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


def _pod_labels() -> list[dict[str, str]]:
    return [
        o["spec"]["template"]["metadata"]["labels"]
        for o in all_objects()
        if o["kind"] in ("Deployment", "StatefulSet")
    ]


def test_services_select_pods_and_their_named_ports() -> None:
    """Each Service's selector matches a workload's pod labels, and a named targetPort is a port
    of that pod's container; the StatefulSet's serviceName is the headless Service."""
    services = {o["metadata"]["name"]: o for o in all_objects() if o["kind"] == "Service"}
    assert set(services) == {"asyncgrpo-server", "asyncgrpo-worker"}
    for service in services.values():
        selector = service["spec"]["selector"]
        matching = [
            o
            for o in all_objects()
            if o["kind"] in ("Deployment", "StatefulSet")
            and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, service["metadata"]["name"]
        named = {p["name"] for c in containers(matching[0]) for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            if isinstance(port.get("targetPort"), str):
                assert port["targetPort"] in named
    sts = _by_kind("StatefulSet", "asyncgrpo-worker")
    assert services[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    # every workload's selector picks its own pods
    for obj in all_objects():
        if obj["kind"] in ("Deployment", "StatefulSet"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert len(_pod_labels()) == 4  # server, jobs, beat, workers


def test_settings_come_from_the_configmap_and_secrets() -> None:
    """Postgres, Redis and the bucket are referenced (external); secrets live in Secrets, and
    every control-plane container reads the same ConfigMap and Secret."""
    settings = _by_kind("ConfigMap", "asyncgrpo-settings")["data"]
    secrets = _by_kind("Secret", "asyncgrpo-secrets")["stringData"]
    assert settings["ASYNCGRPO_BUCKET_URL"].startswith("s3://")
    assert secrets["ASYNCGRPO_DATABASE_URL"].startswith("postgresql")
    assert secrets["ASYNCGRPO_JOBS__BROKER_URL"].startswith("redis://")
    for name in ("ASYNCGRPO_SECURITY__SECRET_KEY", "ASYNCGRPO_S3__SECRET_ACCESS_KEY"):
        assert name in secrets and name not in settings
    for name in ("asyncgrpo-server", "asyncgrpo-jobs", "asyncgrpo-beat"):
        refs = containers(_by_kind("Deployment", name))[0]["envFrom"]
        assert {"configMapRef": {"name": "asyncgrpo-settings"}} in refs
        assert {"secretRef": {"name": "asyncgrpo-secrets"}} in refs
    migrate = containers(_by_kind("Job", "asyncgrpo-migrate"))[0]["envFrom"]
    assert {"secretRef": {"name": "asyncgrpo-secrets"}} in migrate


def test_workers_tolerate_spot_and_gpu_taints_and_request_a_gpu() -> None:
    pod = _by_kind("StatefulSet", "asyncgrpo-worker")["spec"]["template"]["spec"]
    tolerated = {t["key"] for t in pod["tolerations"]}
    spot = {
        "cloud.google.com/gke-spot",
        "kubernetes.azure.com/scalesetpriority",
        "karpenter.sh/capacity-type",
    }
    assert spot | {"nvidia.com/gpu"} <= tolerated
    preferred = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for p in preferred for e in p["preference"]["matchExpressions"]}
    assert "eks.amazonaws.com/capacityType" in keys and spot <= keys
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]


def _pre_stop(pid: int) -> list[str]:
    worker = _by_kind("StatefulSet", "asyncgrpo-worker")["spec"]["template"]["spec"]
    command = list(worker["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    script = command[-1]
    assert script.count(" 1") >= 2  # PID 1: the worker itself (its image's exec ENTRYPOINT)
    command[-1] = script.replace("kill -TERM 1;", f"kill -TERM {pid};").replace(
        "kill -0 1 ", f"kill -0 {pid} "
    )
    return command


@pytest.mark.integration  # runs the hook's shell
def test_pre_stop_hook_signals_and_waits_for_the_exit_within_the_grace() -> None:
    """The hook, run for real against a process that releases for 0.5 s after SIGTERM (as the
    worker does): it returns once that process has exited, not at its own bound; and its bound
    (the loop's tries × 0.1 s) ends inside terminationGracePeriodSeconds."""
    import re
    import threading
    import time

    pod = _by_kind("StatefulSet", "asyncgrpo-worker")["spec"]["template"]["spec"]
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    reaper = threading.Thread(target=proc.wait)  # no zombie left for `kill -0` to find
    reaper.start()
    start = time.monotonic()
    subprocess.run(_pre_stop(proc.pid), check=True, timeout=30)
    took = time.monotonic() - start
    reaper.join(5)
    assert proc.returncode == 0  # it exited through its SIGTERM handler
    assert 0.4 <= took < 3, took
    script = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1]
    tries = int(re.search(r"\$i -lt (\d+)", script).group(1))  # type: ignore[union-attr]
    assert "sleep 0.1" in script
    assert tries * 0.1 < pod["terminationGracePeriodSeconds"]
