"""Write the CPU GSM8K-format example's data: grade-school word problems made by
protocol/word_problems.py, as GSM8K's two columns (`question`, `answer` ending in `#### <n>`).

    .venv/bin/python examples/data/make_word_problems.py [--out examples/data/word-problems]

writes train.jsonl (512 problems, seed 0) and test.jsonl (128 problems, seed 1, none of them a
train question). The files in the repository were written by this script; running it again
writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from protocol.word_problems import problems  # noqa: E402

HERE = Path(__file__).resolve().parent


def splits(n_train: int = 512, n_test: int = 128) -> dict[str, list[dict[str, str]]]:
    train = problems(n_train, seed=0)
    seen = {row["question"] for row in train}
    test = [row for row in problems(4 * n_test, seed=1) if row["question"] not in seen][:n_test]
    return {"train": train, "test": test}


def write(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in splits().items():
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths[name] = path
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "word-problems")
    args = parser.parse_args()
    for name, path in write(args.out).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
