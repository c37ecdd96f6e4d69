"""`--draft mtp` on a Qwen3.5 GGUF (llama.cpp architecture qwen35: gated-delta-net layers, a full-attention layer
every fourth, one MTP layer) with random weights (models/random_mtp.py): no Qwen3.5 weights can be had here.
The target loads its MTP layer, rolls its recurrent layers back after rejected drafts (llama.cpp's state
snapshots), and the MTP layer drafts inside llama.cpp beside it (drafts/mtp.py): greedy text equal to target-only,
and at t = 0.7 and 1 the law of a drafted token equal to the target's, a test that fails on a rule without the residual
step.

The weights make the test strong: the target's law of the next token is near a function of the current token,
peaked over a few, and the MTP layer's law of the token after next near the target's and not equal to it (its
projection passes its token's embedding through, perturbed), so drafts are kept and rejected both many times. The
loop drafts the first token after a prompt (its prefill pass verifies it), so that token is the one drafted."""

import pytest
from conftest import streams_draft_as_one
from stats_util import (
    ALPHA,
    drafted_first_token_p,
    first_logits,
    judged_with_replacement,
    softmax,
    target_instead_of_residual,
)

import edgespec
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.decode import rule as rule_module
from edgespec.errors import EdgespecError
from edgespec.models.random_mtp import write_random_qwen35_mtp
from edgespec.pair import resolve_pair

LAW_PROMPT = "Once upon a time, in a small"


@pytest.fixture(scope="module")
def qwen35(default_gguf, tmp_path_factory):
    return write_random_qwen35_mtp(tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf", tokenizer=default_gguf)


@pytest.fixture(scope="module")
def law_logits(qwen35):
    """The target's logits of the first token after LAW_PROMPT."""
    return first_logits(qwen35, LAW_PROMPT)


def test_mtp_resolves_for_a_qwen35_target_and_says_why_not_for_one_without(qwen35, default_gguf):
    assert resolve_pair(qwen35, "mtp").draft.kind == "mtp"
    assert str(resolve_pair(qwen35, "ngram+mtp").draft) == "ngram+mtp"
    assert resolve_pair(qwen35, "auto").draft.kind == "mtp"  # auto takes a target's own MTP layer
    assert resolve_pair(default_gguf, "auto").draft.kind == "lookup"
    with pytest.raises(EdgespecError, match=r"architecture llama\) carries no MTP layers"):
        resolve_pair(default_gguf, "mtp")


def test_greedy_text_is_target_only_text(qwen35):
    """Chains on a target of one sequence (its recurrent states and their snapshots are per sequence: a chain
    needs one), trees on one of a sequence a branch; both answer as target-only."""
    spec = edgespec.load(qwen35, "mtp", n_ctx=512)
    plain = edgespec.load(qwen35, None, n_ctx=512)
    assert spec.target.recurrent and spec.target.sequences == plain.target.sequences == 1
    drafted = accepted = 0
    for prompt in ("Write a haiku about rain.", "List three prime numbers.", LAW_PROMPT):
        a = spec.generate(prompt, max_tokens=32, temperature=0, draft_max=3, chat=False)
        b = plain.generate(prompt, max_tokens=32, temperature=0, draft_max=0, chat=False)
        assert a.tokens == b.tokens
        drafted += a.stats.drafted
        accepted += a.stats.accepted
    assert drafted >= 3 * 20 and accepted > 0  # rounds drafted, drafts kept and rolled back
    assert accepted < drafted
    trees = edgespec.load(qwen35, "mtp", n_ctx=512, tree_width=3)  # the chain and two siblings per depth
    assert trees.target.sequences == MAX_OUTPUTS
    for prompt in ("Write a haiku about rain.", LAW_PROMPT):
        a = trees.generate(prompt, max_tokens=32, temperature=0, draft_max=3, chat=False)
        assert a.tokens == plain.generate(prompt, max_tokens=32, temperature=0, draft_max=0, chat=False).tokens
        assert a.stats.tree_nodes > a.stats.drafted > 0


# the broken twins at t = 1, one per rule (chains, trees): the same rule runs at t = 0.7
def test_streams_draft_from_one_mtp_context_as_one_stream_does(qwen35):
    """Two streams of the recurrent target (each its own recurrent state and snapshots), the MTP layer's context a
    sequence a stream: greedy answers, kept drafts and the layer's last laws are one stream's."""
    streams_draft_as_one(qwen35, "mtp", ["Write a haiku about rain.", LAW_PROMPT], chat=False)


@pytest.mark.parametrize("temperature, width, broken", [(0.7, 1, False), (1.0, 1, False), (1.0, 1, True),
                                                        (1.0, 3, False), (1.0, 3, True)])
def test_a_drafted_token_follows_the_target_law(qwen35, law_logits, monkeypatch, broken, temperature, width):
    """600 answers at t = 0.7 and 1 whose first token the MTP layer drafted (2000 at width 3: with two siblings,
    verified as distinct candidates): its law is the target's (cells for the tokens likely enough, and the rest).
    Without the residual step (chains), or judging the siblings by the rule for i.i.d. candidates (trees), the test
    fails at the same alpha (p about 1e-11 at t = 1 where the right rule gives 0.2)."""
    from edgespec.decode import verify as verify_module

    if broken and width == 1:
        monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    elif broken:
        monkeypatch.setattr(verify_module, "verify_candidates", judged_with_replacement)
    engine = edgespec.load(qwen35, "mtp", n_ctx=256, tree_width=width)
    runs = 600 if width == 1 else 2000  # the i.i.d. rule on siblings is a smaller error
    p, accepted = drafted_first_token_p(engine, LAW_PROMPT, softmax(law_logits / temperature), runs, temperature,
                                        chat=False)
    assert runs * 0.1 < accepted < runs * 0.9  # kept and rejected drafts, both many times
    assert (p < ALPHA) == broken, p
