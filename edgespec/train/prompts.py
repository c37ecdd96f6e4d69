"""The built-in training prompts (kept apart from the benchmark prompts), and selections of them for make targets:

    python -m edgespec.train.prompts --every 3 --at-most 100      every third of each category, at most 100 each
    python -m edgespec.train.prompts --except FILE                 those not in FILE (JSON lines)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_train_prompts() -> list[dict]:
    """The built-in training prompts (kept apart from the benchmark prompts)."""
    from importlib import resources

    text = resources.files("edgespec").joinpath("data/train_prompts.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def select(prompts: list[dict], *, every: int = 1, at_most: int | None = None) -> list[dict]:
    """Every `every`-th prompt of each category (categories in name order), at most `at_most` of each."""
    return [x for category in sorted({x["cat"] for x in prompts})
            for x in [x for x in prompts if x["cat"] == category][::every][:at_most]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=1, help="every n-th prompt of each category")
    parser.add_argument("--at-most", type=int, default=None, help="at most this many of each category")
    parser.add_argument("--except", dest="exclude", type=Path, default=None,
                        help="leave out the prompts of this JSON-lines file")
    args = parser.parse_args(argv)
    prompts = read_train_prompts()
    if args.every != 1 or args.at_most is not None:  # else in the file's order
        prompts = select(prompts, every=args.every, at_most=args.at_most)
    if args.exclude is not None:
        left_out = [json.loads(line) for line in args.exclude.read_text("utf-8").splitlines() if line.strip()]
        prompts = [x for x in prompts if x not in left_out]
    for x in prompts:
        print(json.dumps(x))


if __name__ == "__main__":
    main()
