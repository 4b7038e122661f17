"""The deploy/ files as data, for the offline checks of tests/deploy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
ADAPTER_RULES = KUSTOMIZE / "prometheus-adapter" / "rules.yaml"
SKYPILOT = ROOT / "deploy" / "skypilot" / "worker.yaml"
# The Kubernetes release the manifests are validated against (kubernetes-validate's schemas).
KUBERNETES_VERSION = "1.32.0"


def kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load((KUSTOMIZE / "kustomization.yaml").read_text()))


def resources() -> list[Path]:
    return [KUSTOMIZE / name for name in kustomization()["resources"]]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_objects() -> Iterator[dict[str, Any]]:
    for path in resources():
        yield from documents(path)


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    pod = spec.get("template", spec.get("jobTemplate", {}).get("spec", {}).get("template", {}))
    pod_spec = pod.get("spec", {})
    return [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]


def env_names(obj: dict[str, Any]) -> set[str]:
    """Names an object sets: a ConfigMap's or Secret's keys, a container's `env`."""
    if obj["kind"] in ("ConfigMap", "Secret"):
        return {*obj.get("data", {}), *obj.get("stringData", {})}
    return {e["name"] for c in containers(obj) for e in c.get("env", [])}
