"""DFlash block drafts in llama.cpp's format on the default model, with random weights (models/random_dflash.py:
no DFlash draft can be had here), drafting inside llama.cpp beside the target (drafts/dflash.py): greedy text equal
to target-only, and at t = 0.7 and 1 the law of a drafted token equal to the target's, a test that fails on a rule
without the residual step.

As for the EAGLE-3 test, the draft keeps a reduced vocabulary (d2t) of 12 ids, the target's most likely first
tokens after the law test's prompt, so its near-uniform law over them shares much of its mass with the target's
there. The loop drafts the first token after a prompt (its prefill pass verifies it), so that token is the one
drafted: block row 1 after the prompt's last token."""

import numpy as np
import pytest
from conftest import streams_draft_as_one
from stats_util import ALPHA, drafted_first_token_p, first_logits, softmax, target_instead_of_residual

import edgespec
from edgespec.decode import rule as rule_module
from edgespec.drafts.llama_kinds import describe, gguf_meta, llama_kind
from edgespec.errors import EdgespecError
from edgespec.models.random_dflash import write_random_dflash
from edgespec.pair import resolve_pair

LAW_PROMPT = "Once upon a time, in a small"
LAYERS = [2, 15, 28]  # layer inputs, as the converter writes them (the checkpoint's ids + 1)


@pytest.fixture(scope="module")
def law_logits(default_gguf):
    return first_logits(default_gguf, LAW_PROMPT)


@pytest.fixture(scope="module")
def block(default_gguf, law_logits, tmp_path_factory):
    ids = np.sort(np.argsort(law_logits)[::-1][:12])
    return write_random_dflash(tmp_path_factory.mktemp("dflash") / "block.gguf", default_gguf, layers=LAYERS,
                               draft_ids=ids)


def test_the_block_draft_is_named_and_resolves_beside_its_target_only(block, default_gguf, tmp_path):
    meta = gguf_meta(block)
    assert describe(meta) == "a DFlash block draft (GGUF architecture dflash, reading its layers 2, 15, 28)"
    assert llama_kind(block) == "dflash" and resolve_pair(default_gguf, block).draft.source == str(block)
    other = write_random_dflash(tmp_path / "wide.gguf", default_gguf, layers=LAYERS)
    from edgespec.backends import gguf_file

    reader = gguf_file.open_gguf(other, "r+")  # the same file as if converted for a target 1024 wide
    reader.fields["dflash.embedding_length"].parts[-1][0] = 1024
    del reader
    with pytest.raises(EdgespecError, match="converted for another target \\(this target is 576 wide\\)"):
        resolve_pair(default_gguf, other)


def test_greedy_text_is_target_only_text(default_gguf, block):
    spec = edgespec.load(default_gguf, str(block), n_ctx=512)
    plain = edgespec.load(default_gguf, None, n_ctx=512)
    drafted = 0
    for prompt in ("Write a haiku about rain.", LAW_PROMPT):
        a = spec.generate(prompt, max_tokens=24, temperature=0, draft_max=5)
        b = plain.generate(prompt, max_tokens=24, temperature=0, draft_max=0)
        assert a.tokens == b.tokens
        drafted += a.stats.drafted
    assert drafted >= 2 * 20 * 5 // 2  # blocks of five drafted nearly every round
    trees = edgespec.load(default_gguf, str(block), n_ctx=512, tree_width=3)  # siblings from the block's rows
    for prompt in ("Write a haiku about rain.", LAW_PROMPT):
        a = trees.generate(prompt, max_tokens=24, temperature=0, draft_max=3)
        assert a.tokens == plain.generate(prompt, max_tokens=24, temperature=0, draft_max=0).tokens
        assert a.stats.tree_nodes > a.stats.drafted > 0


def test_streams_draft_from_one_block_context_as_one_stream_does(reference_pair, block):
    """Two streams beside the f32 target, the block draft's context a sequence a stream: greedy answers and kept
    drafts are one stream's."""
    streams_draft_as_one(reference_pair[0], str(block), ["Write a haiku about rain.", LAW_PROMPT])


@pytest.mark.parametrize("temperature, broken", [(0.7, False), (1.0, False), (1.0, True)])  # one twin: one rule
def test_a_drafted_token_follows_the_target_law(default_gguf, block, law_logits, monkeypatch, broken, temperature):
    """600 answers whose first token the block drafted: its law is the target's (cells for the tokens likely
    enough, and the rest). Without the residual step the test fails at the same alpha."""
    if broken:
        monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    engine = edgespec.load(default_gguf, str(block), n_ctx=256)
    p, accepted = drafted_first_token_p(engine, LAW_PROMPT, softmax(law_logits / temperature), 600, temperature,
                                        chat=False)
    assert 600 * 0.1 < accepted < 600 * 0.9  # kept and rejected drafts, both many times
    assert (p < ALPHA) == broken, p
