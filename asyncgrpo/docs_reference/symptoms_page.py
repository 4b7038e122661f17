"""docs/reference/symptoms.md: troubleshooting by symptom, from the one table the dashboard's drift
banner reads too (server/dashboard/symptoms.py)."""

from __future__ import annotations

from collections.abc import Iterator

from asyncgrpo.docs_reference.markdown import cell, code, page, table
from server.dashboard.symptoms import SYMPTOMS, Symptom

INTRO = """
What a symptom of a run means, the figures that show it and the settings that change it. This
page is rendered from `server/dashboard/symptoms.py`, the table the dashboard's drift banner
takes its advice from (the run page and the runs list, while an alarm is at or above its
threshold), so the two say the same. Run-config fields are in
[the run configuration reference](run-config.md), worker and learner options in
[the command-line reference](cli.md); a refused call's `code` is in
[Troubleshooting by error code](../guides/troubleshooting.md).
"""


def _anchor(title: str) -> str:
    """The heading's id as Python-Markdown's toc makes it."""
    return "-".join("".join(c for c in title.lower() if c.isalnum() or c == " ").split())


def _summary(symptoms: tuple[Symptom, ...]) -> str:
    rows = [
        (
            f"[{s.title}](#{_anchor(s.title)})",
            code(s.alarm) if s.alarm else "—",
            ", ".join(code(setting) for setting in s.settings),
        )
        for s in symptoms
    ]
    return table(("Symptom", "Alarm", "Settings that change it"), rows)


def _section(symptom: Symptom) -> Iterator[str]:
    yield f"## {symptom.title}\n\n{cell(symptom.meaning)}\n"
    if symptom.alarm:
        yield (
            f"Alarm: {code(symptom.alarm)} (its threshold in the run config's `alarms` block; an "
            "`alarm.*` event and the webhook when it fires).\n"
        )
    yield "Look at:\n\n" + "\n".join(f"- {cell(f)}" for f in symptom.figures) + "\n"
    rows = [(code(c.setting), cell(c.how)) for c in symptom.changes]
    yield "Change:\n\n" + table(("Setting", "How"), rows)


def render() -> str:
    sections = [_summary(SYMPTOMS)]
    for symptom in SYMPTOMS:
        sections += list(_section(symptom))
    return page("Troubleshooting by symptom", INTRO, sections)
