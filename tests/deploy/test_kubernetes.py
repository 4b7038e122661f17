"""deploy/kubernetes, offline: every object passes `kubernetes-validate --strict` against a
pinned Kubernetes release, the kustomization lists every manifest and renders (with kubectl's
built-in kustomize when it is installed), and the deployment's promises hold: one beat, the
jobs off the server, workers keeping their token on a per-pod volume and given time to release
their leases on SIGTERM. Not run on a cluster."""

from __future__ import annotations

import shutil
import subprocess
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
