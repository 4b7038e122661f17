"""Citations of the docs resolve (docs/architecture/index.md, "Changing a rule"): every
`docs/<page>.md` a file names exists, every `docs/<page>.md, "Heading"` names a heading of that
page, every "invariant N" is defined on the contract page, every relative link between doc pages
(and from the README into them) reaches its page and heading, every other relative link of
those pages reaches its file, and nothing cites the retired single architecture file. Pure
file reading: no sockets, subprocesses or databases."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = (
    "asyncgrpo",
    "bench",
    "deploy",
    "docker",
    "docs",
    "examples",
    "learner",
    "lm",
    "migrations",
    "protocol",
    "scripts",
    "server",
    "tests",
    "worker",
)
SCANNED_FILES = ("README.md", "pyproject.toml", "mkdocs.yml")
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".html", ".ini", ".cfg", ".txt"}
CONTRACT = "docs/architecture/contract.md"

# `docs/<page>.md`, optionally followed by `, "Heading"` (the heading may wrap, in a comment too).
CITATION = re.compile(r'\bdocs/((?:[\w.-]+/)*[\w.-]+\.md)(?:#[\w-]+)?(?:,\s+"([^"]{1,120})")?')
INVARIANTS = re.compile(r"\binvariants?\b((?:(?:\s|#|,|\band\b|\bor\b)+\d+\b)+)")
RETIRED = re.compile(r"\barchitecture\.md\b|\barchitecture,?\s+(?:section\s+\d|§)")
RELATIVE_LINK = re.compile(r"\]\((?!https?:|mailto:|/)([^)\s#]+\.md)(?:#([\w-]+))?\)")
FILE_LINK = re.compile(r"\]\((?!https?:|mailto:|/|#)([^)\s#]+)(?:#[\w-]*)?\)")  # any other file
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
NUMBERED = re.compile(r"^\d+[a-z]?\.\s+")
DEFINED_INVARIANT = re.compile(r"^(\d+)\.\s+\*\*", re.M)


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def normalised(heading: str) -> str:
    """A heading as citations name it: no markup, no numbering prefix ("3. Protocol")."""
    text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", heading)
    text = re.sub(r"[`*]", "", text).strip()
    return " ".join(NUMBERED.sub("", text).split()).casefold()


def anchor(heading: str) -> str:
    """The id Python-Markdown's toc gives a heading (mkdocs' default)."""
    text = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", heading))
    text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(text: str) -> list[str]:
    """The markdown headings of a page, fenced code left out."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append(match.group(1))
    return found


def scanned(root: Path) -> Iterator[Path]:
    for name in SCANNED_FILES:
        if (root / name).is_file():
            yield root / name
    for folder in SCANNED_DIRS:
        for path in sorted((root / folder).rglob("*")):
            parts = path.relative_to(root).parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            if path.suffix in SUFFIXES and path.is_file():
                yield path


class Pages:
    """The doc pages of one tree, read once each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._headings: dict[Path, list[str] | None] = {}

    def headings_of(self, page: Path) -> list[str] | None:
        if page not in self._headings:
            self._headings[page] = headings(page.read_text()) if page.is_file() else None
        return self._headings[page]

    def invariants(self) -> set[int]:
        contract = self.root / CONTRACT
        if not contract.is_file():
            return set()
        return {int(n) for n in DEFINED_INVARIANT.findall(contract.read_text())}


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _citations(rel: str, text: str, pages: Pages) -> Iterator[Problem]:
    for match in CITATION.finditer(text):
        page, heading = match.group(1), match.group(2)
        found = pages.headings_of(pages.root / "docs" / page)
        if found is None:
            yield Problem(rel, _line(text, match.start()), f"docs/{page} does not exist")
        elif heading and normalised(heading) not in {normalised(h) for h in found}:
            message = f'docs/{page} has no heading "{normalised(heading)}"'
            yield Problem(rel, _line(text, match.start()), message)


def _invariants(rel: str, text: str, defined: set[int]) -> Iterator[Problem]:
    for match in INVARIANTS.finditer(text):
        for number in re.findall(r"\d+", match.group(1)):
            if int(number) not in defined:
                message = f"invariant {number} is not defined on {CONTRACT}"
                yield Problem(rel, _line(text, match.start()), message)


def _links(path: Path, rel: str, text: str, pages: Pages) -> Iterator[Problem]:
    for match in RELATIVE_LINK.finditer(text):
        target, fragment = match.group(1), match.group(2)
        found = pages.headings_of((path.parent / target).resolve())
        line = _line(text, match.start())
        if found is None:
            yield Problem(rel, line, f"link {target} does not resolve")
        elif fragment and fragment not in {anchor(h) for h in found}:
            yield Problem(rel, line, f"link {target}#{fragment}: no such heading")
    for match in FILE_LINK.finditer(text):
        target = match.group(1)
        if not target.endswith(".md") and not (path.parent / target).exists():
            yield Problem(rel, _line(text, match.start()), f"link {target} does not resolve")


def problems(root: Path) -> list[Problem]:
    pages = Pages(root)
    defined = pages.invariants()
    found: list[Problem] = []
    for path in scanned(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(errors="replace")
        found.extend(_citations(rel, text, pages))
        found.extend(_invariants(rel, text, defined))
        found.extend(
            Problem(rel, _line(text, m.start()), "cites the retired architecture file")
            for m in RETIRED.finditer(text)
        )
        if (rel.startswith("docs/") and path.suffix == ".md") or rel == "README.md":
            found.extend(_links(path, rel, text, pages))
    return found


def test_every_citation_in_the_repository_resolves() -> None:
    found = problems(ROOT)
    assert not found, "\n".join(map(str, found))


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def test_the_guides_and_benchmarks_are_scanned() -> None:
    """The pages that moved out of the README are checked like the architecture's."""
    pages = {p.relative_to(ROOT).as_posix() for p in scanned(ROOT)}
    for folder in ("docs/guides", "docs/benchmarks"):
        on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob("*.md")}
        assert on_disk and on_disk <= pages, folder
    assert {"README.md", "mkdocs.yml", "docs/index.md"} <= pages


def test_the_checker_names_each_bad_citation(tmp_path: Path) -> None:
    """Written with the names split, so that this file cites nothing itself."""
    docs, old = "docs/", "architecture" + ".md"
    _write(tmp_path, CONTRACT, "# The contract\n\n## Invariants\n\n1. **One.** x\n2. **Two.** y\n")
    page_a = "# A page\n\n## 3. Numbered part\n\n```\n# not a heading\n```\n"
    _write(tmp_path, f"{docs}a.md", page_a)
    _write(
        tmp_path,
        "server/x.py",
        f'"""Fine: ({docs}a.md, "Numbered part"; {docs}a.md, "A\n'
        f'page"; invariants 1 and 2).\n'
        f'Bad: {docs}missing.md; ({docs}a.md, "Not a heading"); ({docs}a.md, "not a heading");\n'
        f'invariant {7}; invariants 1,\n{9}; {docs}{old}."""\n',
    )
    page_b = "# B\n\n[ok](a.md#3-numbered-part) [gone](c.md) [bad](a.md#nope) [no](x.json)\n"
    _write(tmp_path, f"{docs}b.md", page_b)
    _write(tmp_path, "LICENSE", "")
    readme = f"# R\n\n[ok]({docs}a.md) [gone]({docs}c.md) [ok](LICENSE) [no](NOTICE)\n"
    _write(tmp_path, "README.md", readme)
    assert sorted(map(str, problems(tmp_path))) == sorted(
        [
            f"server/x.py:3: {docs}missing.md does not exist",
            f'server/x.py:3: {docs}a.md has no heading "not a heading"',
            f'server/x.py:3: {docs}a.md has no heading "not a heading"',
            f"server/x.py:4: invariant 7 is not defined on {CONTRACT}",
            f"server/x.py:4: invariant 9 is not defined on {CONTRACT}",
            f"server/x.py:5: {docs}{old} does not exist",
            "server/x.py:5: cites the retired architecture file",
            f"README.md:3: {docs}c.md does not exist",
            f"README.md:3: link {docs}c.md does not resolve",
            f"{docs}b.md:3: link c.md does not resolve",
            f"{docs}b.md:3: link a.md#nope: no such heading",
            f"{docs}b.md:3: link x.json does not resolve",
            "README.md:3: link NOTICE does not resolve",
        ]
    )


def test_headings_match_without_markup_or_numbering() -> None:
    assert normalised("4a. Evaluation during  training") == "evaluation during training"
    assert normalised("`env_mismatch`") == "env_mismatch"
    assert anchor("`verifiers` environments") == "verifiers-environments"
    assert anchor("Sampling, log-probs and the GRPO loss") == "sampling-log-probs-and-the-grpo-loss"
