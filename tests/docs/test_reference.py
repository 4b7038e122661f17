"""docs/reference/ is generated from the code (asyncgrpo/docs_reference/): every committed page
equals what the code renders now, nothing shown lacks a description, and the pieces (env-var
names, option rows, escaped cells, per-variant unions) do what they say on small models."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import markdown
import pytest
import typer
from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from asyncgrpo.docs_reference import __main__ as generator
from asyncgrpo.docs_reference import pages
from asyncgrpo.docs_reference.cli_page import render_app
from asyncgrpo.docs_reference.fields import default_label
from asyncgrpo.docs_reference.http_api_page import auth, responses, undescribed
from asyncgrpo.docs_reference.markdown import cell, table
from asyncgrpo.docs_reference.run_config_page import block_section, blocks, constraints
from asyncgrpo.docs_reference.settings_page import groups

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return pages.render_all()


def test_every_committed_page_is_what_the_code_renders(rendered: dict[str, str]) -> None:
    stale = pages.stale_pages(pages.REFERENCE_DIR, rendered)
    why = "\n".join(f"docs/reference/{name}: {reason}" for name, reason in stale.items())
    assert not stale, f"stale pages (regenerate: python -m asyncgrpo.docs_reference):\n{why}"


def test_every_setting_field_and_operation_has_a_description() -> None:
    assert pages.missing_descriptions() == []


def test_the_pages_hold_nothing_of_this_machine(rendered: dict[str, str]) -> None:
    here = [str(Path.home()), os.getcwd(), str(ROOT)]
    for name, text in rendered.items():
        for found in here:
            assert found == "/" or found not in text, (name, found)


def test_the_pages_render_as_tables_in_python_markdown(rendered: dict[str, str]) -> None:
    """Each table row has its header's cells: no `|` of a description split a cell."""
    for name, text in rendered.items():
        html = markdown.markdown(text, extensions=["tables"])
        for block in html.split("<table>")[1:]:
            head = block.split("</thead>")[0].count("<th>")
            for row in block.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]:
                assert row.count("<td>") == head, (name, row[:200])


# -- the pieces, on small inputs ---------------------------------------------------------------


class Inner(BaseModel):
    """A nested group."""

    port: int = Field(8080, description="The port.")


class OwnPrefix(BaseSettings):
    """A nested settings group with its own prefix."""

    model_config = SettingsConfigDict(env_prefix="APP_ENGINE_")
    depth: int = Field(2, description="How deep.")


class AppSettings(BaseSettings):
    """Root."""

    model_config = SettingsConfigDict(env_prefix="APP_", env_nested_delimiter="__")
    url: str = Field(
        "http://x",
        validation_alias=AliasChoices("url", "APP_URL", "APP_SERVER"),
        description="Where.",
    )
    inner: Inner = Field(default_factory=Inner, description="Inner group.")
    engine: OwnPrefix = Field(default_factory=OwnPrefix, description="Engine group.")


def _variables(rows: list[tuple[str, ...]], setting: str) -> str:
    (row,) = [r for r in rows if r[0] == f"`{setting}`"]
    return row[1]


def test_a_nested_field_is_named_as_pydantic_settings_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, inner, engine = groups(AppSettings)
    assert _variables(inner.rows, "port") == "`APP_INNER__PORT`"
    assert _variables(engine.rows, "depth") == "`APP_ENGINE_DEPTH`"
    assert _variables(root.rows, "url") == "`APP_URL`, `APP_SERVER`, `URL`"
    monkeypatch.setenv("APP_INNER__PORT", "9")
    monkeypatch.setenv("APP_ENGINE_DEPTH", "7")
    monkeypatch.setenv("APP_SERVER", "http://y")
    read = AppSettings()
    assert (read.inner.port, read.engine.depth, read.url) == (9, 7, "http://y")


def test_a_typer_option_renders_its_row() -> None:
    app = typer.Typer()

    @app.command()
    def greet(
        name: str = typer.Option("world", envvar="GREET_NAME", help="Who | whom to greet."),
        times: int = typer.Option(1, min=1, help="How often."),
    ) -> None:
        """Say hello."""

    @app.command()
    def other() -> None:
        """Another command, so that greet is a subcommand."""

    text = "\n".join(render_app(app, "demo"))
    assert "## `demo greet`\n\nSay hello." in text
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    assert "| `--name` | str | `world` | `GREET_NAME` | Who \\| whom to greet. |" in rows
    assert "| `--times` | int, ≥ 1 | `1` | — | How often. |" in rows


def test_a_pipe_angle_bracket_or_star_in_a_cell_stays_in_its_cell() -> None:
    text = table(("A", "B"), [(cell("x | y"), cell("`a|b` or <tag> and *not em*, `<code>`"))])
    html = markdown.markdown(text, extensions=["tables"])
    assert html.count("<td>") == 2
    assert "x | y" in html and "a|b" in html and "&lt;tag&gt;" in html
    assert "<em>" not in html and "<tag>" not in html
    assert "<code>&lt;code&gt;</code>" in html


class _Secrets(BaseModel):
    api_token: str | None = "agr_x"
    print_admin_token: bool = True
    where: Path = Field(Path.home() / ".cache" / "x")
    shown: Path = Field(Path.home(), json_schema_extra={"shown_default": "~"})


def test_a_secret_default_is_hidden_and_a_machine_default_refused() -> None:
    fields = _Secrets.model_fields
    assert default_label("api_token", fields["api_token"]) == "(secret)"
    assert default_label("print_admin_token", fields["print_admin_token"]) == "`true`"
    assert default_label("shown", fields["shown"]) == "`~`"
    if str(Path.home()) != "/":
        with pytest.raises(ValueError, match="depends on the machine"):
            default_label("where", fields["where"])


class KindA(BaseModel):
    """The first kind."""

    kind: Literal["a"] = Field("a", description="Kind a.")
    size: int = Field(1, ge=1, le=5, description="Size.")


class KindB(BaseModel):
    """The second kind."""

    kind: Literal["b"] = Field("b", description="Kind b.")
    RULES: ClassVar[dict[str, tuple[object, str]]] = {"name": (bool, "must be 1 to 9 characters")}
    name: str = Field(description="Name.")


class Config(BaseModel):
    source: Annotated[KindA | KindB, Field(discriminator="kind")] = Field(description="From.")
    backup: KindA | KindB | None = Field(None, description="Also.")


def test_a_discriminated_union_is_listed_per_variant_once() -> None:
    (block,) = blocks(Config)
    assert block.paths == ["source", "backup"]
    text = "\n".join(block_section(block))
    assert "One of these, chosen by `kind`" in text
    assert "### `kind`: `a`\n\nThe first kind." in text and "### `kind`: `b`" in text
    assert constraints(KindA, "size", KindA.model_fields["size"]) == "≥ 1; ≤ 5"
    assert constraints(KindB, "name", KindB.model_fields["name"]) == "must be 1 to 9 characters"


def test_an_operation_without_a_docstring_is_reported() -> None:
    document = {
        "paths": {
            "/b": {"get": {"summary": "B", "tags": ["t"]}},
            "/a": {"post": {"summary": "A", "description": "Does A.", "tags": ["t"]}},
        }
    }
    assert undescribed(document) == ["GET /b"]


def test_responses_group_by_body_and_auth_names_the_scheme() -> None:
    error = {"content": {"application/json": {"schema": {"$ref": "#/x/ErrorBody"}}}}
    operation = {
        "responses": {"404": error, "200": {"content": {}}, "401": error},
        "security": [{"Bearer": []}],
    }
    assert responses(operation) == "`200`; `401`, `404` `ErrorBody`"
    assert auth(operation, {"Bearer": {"type": "http", "scheme": "bearer"}}) == "bearer token"
    bearer = {"type": "http", "scheme": "bearer"}
    admin = {"security": [{"AdminToken": []}]}
    assert auth(admin, {"AdminToken": bearer}) == "admin token"
    assert auth({"security": [{"Key": []}]}, {"Key": {"type": "apiKey"}}) == "apiKey"
    assert auth({}, {}) == "open"


def test_check_names_each_stale_page_and_its_first_differing_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        pages, "PAGES", {"a.md": lambda: "# A\n\nsame\nnew\n", "b.md": lambda: "B\n"}
    )
    assert generator.main(["--out", str(tmp_path)]) == 0
    assert generator.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "a.md").write_text("# A\n\nsame\nold\n")
    (tmp_path / "b.md").unlink()
    assert generator.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "a.md: line 4: expected 'new', found 'old'" in err
    assert "b.md: missing" in err
