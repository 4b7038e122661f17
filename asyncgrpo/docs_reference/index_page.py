"""docs/reference/index.md: what the reference pages are and how they are made."""

from __future__ import annotations

from asyncgrpo.docs_reference.markdown import REGENERATE, page

PAGES = {
    "settings.md": ("Settings", "every setting of the server, the worker, the learner and "
                    "`asyncgrpo local`, with its environment variables"),
    "run-config.md": ("Run configuration", "the body of `POST /api/v1/runs`: every block and "
                      "field, the dataset kinds, the built-in rewards and environments"),
    "cli.md": ("Command line", "every `asyncgrpo` command and its options"),
    "http-api.md": ("HTTP API", "every operation of the control plane, by tag"),
    "error-codes.md": ("Error codes", "every error `code` with its HTTP status and meaning"),
    "symptoms.md": ("Troubleshooting by symptom", "what a run's symptom means, the figures "
                    "that show it and the settings that change it (the drift banner's table)"),
    "gpu-prices.md": ("GPU prices and speeds", "the on-demand prices, example offers and "
                      "speeds the cost page and the planner start from, with source and date"),
}  # fmt: skip

INTRO = f"""
These pages are generated from the code (the pydantic models, the Typer application, the
app's OpenAPI document, `protocol/error_codes.py`, `server/dashboard/symptoms.py` and
`protocol/gpu_prices.py`); do not edit them. Regenerate them with
`{REGENERATE}` after changing what they show; `{REGENERATE} --check` (and
`tests/docs/test_reference.py`) fails naming each page that is stale.
"""


def render() -> str:
    links = "\n".join(f"- [{title}]({name}): {what}." for name, (title, what) in PAGES.items())
    return page("Reference", INTRO, [links + "\n"])
