"""What every benchmark prints for machines: with `--json`, one JSON object as its last line,
so that figures can be compared run to run (tables stay for people)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="After the tables, print the figures as one JSON object on the last line.",
    )


def emit(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Print `figures` as the last line when the benchmark was asked for --json."""
    if args.json:
        print(json.dumps(figures, sort_keys=True, default=str), flush=True)
