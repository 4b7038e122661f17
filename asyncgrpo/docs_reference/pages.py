"""The reference pages, each rendered from the code, and the comparison with the committed ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from asyncgrpo.docs_reference import (
    cli_page,
    error_codes_page,
    gpu_prices_page,
    http_api_page,
    index_page,
    run_config_page,
    settings_page,
    symptoms_page,
)

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference"

PAGES: dict[str, Callable[[], str]] = {
    "index.md": index_page.render,
    "settings.md": settings_page.render,
    "run-config.md": run_config_page.render,
    "cli.md": cli_page.render,
    "http-api.md": http_api_page.render,
    "error-codes.md": error_codes_page.render,
    "symptoms.md": symptoms_page.render,
    "gpu-prices.md": gpu_prices_page.render,
}


def render_all() -> dict[str, str]:
    """Every page's text, by file name."""
    return {name: render() for name, render in PAGES.items()}


def first_difference(expected: str, found: str) -> str:
    """Where `found` first differs from `expected`: `line 12: expected '…', found '…'`."""
    want, got = expected.splitlines(), found.splitlines()
    for number, (a, b) in enumerate(zip(want, got, strict=False), start=1):
        if a != b:
            return f"line {number}: expected {a!r}, found {b!r}"
    if len(want) != len(got):
        number = min(len(want), len(got)) + 1
        missing = want[number - 1] if len(want) > len(got) else "(end of page)"
        extra = got[number - 1] if len(got) > len(want) else "(end of page)"
        return f"line {number}: expected {missing!r}, found {extra!r}"
    return "the line endings differ"


def stale_pages(folder: Path, rendered: dict[str, str]) -> dict[str, str]:
    """Each page whose file in `folder` is missing or differs from `rendered`, with why."""
    stale = {}
    for name, text in rendered.items():
        path = folder / name
        if not path.exists():
            stale[name] = "missing"
        elif (found := path.read_text(encoding="utf-8")) != text:
            stale[name] = first_difference(text, found)
    return stale


def missing_descriptions() -> list[str]:
    """Settings, run-config fields and API operations that the reference would show without a
    description."""
    return [
        *settings_page.missing_descriptions(),
        *run_config_page.missing_descriptions(),
        *http_api_page.missing_descriptions(),
    ]
