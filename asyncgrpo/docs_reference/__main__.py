"""`python -m asyncgrpo.docs_reference`: write the reference pages into docs/reference/;
`--check` writes nothing and exits 1 naming each stale page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asyncgrpo.docs_reference.pages import REFERENCE_DIR, render_all, stale_pages


def _shown(path: Path) -> str:
    """The path from the repository's root when it is inside it (docs/reference/cli.md)."""
    root = REFERENCE_DIR.parents[1]
    resolved = path.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo.docs_reference")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR, help="the pages' folder")
    args = parser.parse_args(argv)
    rendered = render_all()
    if args.check:
        stale = stale_pages(args.out, rendered)
        for name, why in stale.items():
            print(f"stale: {_shown(args.out / name)}: {why}", file=sys.stderr)
        if stale:
            print("regenerate with: python -m asyncgrpo.docs_reference", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (args.out / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(rendered)} pages to {_shown(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
