"""Cross-tokenizer drafts draw the target's law, and a broken rule is caught."""

import pytest
from fake import FakeBackend
from stats_util import check_target_law
from test_cross import TARGET, cross_pair, vocab

from edgespec.decode.laws import Weights
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.cross import CrossDrafter


class Unrenormalised(CrossDrafter):
    """The bug transformers#47932 names: the rule divides by the draft's law before restriction (mass outside the
    intersection still counted), not the law the token was drawn from."""

    def propose(self, context, k, params, rng, **options):
        tokens, laws = super().propose(context, k, params, rng, **options)
        return tokens, [Weights(q.ids, q.w, q.total / 0.5) for q in laws]


@pytest.mark.parametrize("kind, broken", [(CrossDrafter, False), (CrossDrafter, True), (Unrenormalised, True)],
                         ids=["exact", "no-residual", "unrenormalised"])
def test_cross_tokenizer_drafts_draw_the_target_law(monkeypatch, kind, broken):
    """Three tokens' joint law is the target chain's, with the draft's words outside the intersection carrying
    mass; a rule without the residual, or one dividing by the unrestricted draft law, is caught."""
    table, draft = cross_pair(2)
    draft.table[:, 4:] += 1.0  # "ca" and "bb", which the target cannot take: mass the restriction removes
    target = FakeBackend(table, vocab=vocab(TARGET))
    drafted = check_target_law(monkeypatch, target, kind(draft, vocab(TARGET)), table, SamplingParams(temperature=1.0),
                               width=1, broken=broken and kind is CrossDrafter, n_tokens=3, runs=4000,
                               caught=broken)
    assert drafted > 1  # tokens drafted per answer
