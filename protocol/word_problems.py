"""Grade-school word problems in GSM8K's format, made by the project itself (the Hub cannot be
reached on CPU test machines): a `question` and an `answer` that shows its working with
GSM8K's `<<a+b=c>>` calculator annotations and ends with `#### <number>`.

One- and two-step problems over small whole numbers (addition, subtraction, multiplication,
equal sharing, change from a bill); every answer is a non-negative integer. The same seed gives
the same problems. `examples/data/make_word_problems.py` writes them as JSONL files.
"""

from __future__ import annotations

import random
from collections.abc import Callable

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Finn", "Grace", "Hugo", "Ivy", "Jack")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")
GOODS = ("notebook", "toy car", "sandwich", "comic book", "bottle of juice", "ball")

Problem = tuple[str, str, int]  # question, working, answer


def _more(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    return (
        f"{name} has {a} {item}. {name} gets {b} more {item}. "
        f"How many {item} does {name} have now?",
        f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item} now.",
        a + b,
    )


def _give_away(rng: random.Random, name: str, item: str) -> Problem:
    b = rng.randint(1, 20)
    a = b + rng.randint(1, 25)
    return (
        f"{name} has {a} {item} and gives {b} of them to a friend. "
        f"How many {item} does {name} have left?",
        f"{name} has {a} - {b} = <<{a}-{b}={a - b}>>{a - b} {item} left.",
        a - b,
    )


def _boxes(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return (
        f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy?",
        f"{name} buys {a} * {b} = <<{a}*{b}={a * b}>>{a * b} {item}.",
        a * b,
    )


def _share(rng: random.Random, name: str, item: str) -> Problem:
    each, friends = rng.randint(2, 12), rng.randint(2, 8)
    total = each * friends
    return (
        f"{name} shares {total} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?",
        f"Each friend gets {total} / {friends} = <<{total}/{friends}={each}>>{each} {item}.",
        each,
    )


def _packs_eaten(rng: random.Random, name: str, item: str) -> Problem:
    packs, per_pack = rng.randint(2, 6), rng.randint(3, 10)
    total = packs * per_pack
    used = rng.randint(1, total - 1)
    return (
        f"{name} buys {packs} packs of {item} with {per_pack} in each pack and then loses {used} "
        f"of them. How many {item} does {name} have left?",
        f"{name} buys {packs} * {per_pack} = <<{packs}*{per_pack}={total}>>{total} {item}.\n"
        f"After losing {used}, {name} has {total} - {used} = <<{total}-{used}={total - used}>>"
        f"{total - used} {item} left.",
        total - used,
    )


def _change(rng: random.Random, name: str, _item: str) -> Problem:
    good = rng.choice(GOODS)
    price, count = rng.randint(1, 9), rng.randint(2, 5)
    cost = price * count
    bill = 50 if cost > 20 else 20
    return (
        f"A {good} costs ${price}. {name} buys {count} of them and pays with a ${bill} bill. "
        f"How many dollars of change does {name} get?",
        f"{count} of them cost {count} * {price} = <<{count}*{price}={cost}>>{cost} dollars.\n"
        f"The change is {bill} - {cost} = <<{bill}-{cost}={bill - cost}>>{bill - cost} dollars.",
        bill - cost,
    )


TEMPLATES: tuple[Callable[[random.Random, str, str], Problem], ...] = (
    _more,
    _give_away,
    _boxes,
    _share,
    _packs_eaten,
    _change,
)


def problems(size: int, seed: int) -> list[dict[str, str]]:
    """`size` problems as GSM8K rows: {"question": …, "answer": "<working>\\n#### <n>"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        template = rng.choice(TEMPLATES)
        question, working, answer = template(rng, rng.choice(NAMES), rng.choice(ITEMS))
        rows.append({"question": question, "answer": f"{working}\n#### {answer}"})
    return rows


def final_answer(answer: str) -> str:
    """The number after GSM8K's `####` marker."""
    return answer.rsplit("####", 1)[-1].strip()
