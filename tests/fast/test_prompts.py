"""The built-in prompt sets: drafts train on edgespec/data/train_prompts.jsonl and are measured on the benchmark's
edgespec/data/prompts.jsonl, so no benchmark prompt may be a training one (a head trained on a benchmark prompt's
answers is measured on text it has seen)."""

from edgespec.bench import read_prompts
from edgespec.train.prompts import read_train_prompts


def canonical(prompt: str) -> str:
    return " ".join(prompt.lower().split())


def test_no_benchmark_prompt_is_a_training_prompt():
    train = {canonical(row["prompt"]) for row in read_train_prompts()}
    shared = [row["prompt"] for row in read_prompts(None) if canonical(row["prompt"]) in train]
    assert not shared, shared


def test_the_training_prompts_are_distinct_and_cover_the_benchmark_categories():
    train = read_train_prompts()
    assert len({canonical(row["prompt"]) for row in train}) == len(train)
    assert {row["cat"] for row in read_prompts(None)} <= {row["cat"] for row in train}
