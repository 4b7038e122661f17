"""Run by tests/deploy/test_skypilot.py inside .venv-skypilot (scripts/install_skypilot.sh):
SkyPilot's own task schema and its YAML loader judge a task file. Prints JSON; exits 1 with
SkyPilot's message when the file is refused."""

from __future__ import annotations

import json
import sys

import yaml
from sky import Task
from sky.utils import common_utils, schemas


def main(path: str) -> int:
    with open(path) as f:
        config = yaml.safe_load(f)
    try:
        common_utils.validate_schema(config, schemas.get_task_schema(), "Invalid task YAML: ")
        task = Task.from_yaml(path)
    except Exception as exc:  # SkyPilot raises several kinds; the test reads the message
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    resources = [
        {"use_spot": r.use_spot, "accelerators": r.accelerators, "cloud": str(r.cloud)}
        for r in task.resources
    ]
    print(json.dumps({"envs": sorted(task.envs), "resources": resources}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
