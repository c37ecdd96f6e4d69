"""EAGLE drafts keep the target's chain law, and a broken rule is caught."""

import numpy as np
import pytest
from fake import EOS, random_table
from stats_util import check_target_law, random_gates
from test_eagle import T08, T1, E, HiddenFake, V, head_file

from edgespec.drafts.eagle import EagleDrafter


@pytest.mark.parametrize("params, width, broken, runner, gated", [
    (T1, 1, False, "ggml", False), (T1, 1, False, "numpy", False), (T08, 1, False, "ggml", False),
    (T1, 1, True, "ggml", False), (T1, 2, False, "ggml", False), (T08, 3, False, "ggml", False),
    (T1, 3, True, "ggml", False), (T1, 1, False, "ggml", True), (T08, 1, False, "ggml", True)])
def test_eagle_drafts_follow_the_target_chain(tmp_path, monkeypatch, params, width, broken, runner, gated):
    """Four tokens from the loop drafted by a random EAGLE head whose output leaves out token 3 (draft
    probability 0 there), run in llama.cpp or numpy, as chains (to a fixed length or as far as the gate lets
    them) or as trees 3 deep (the head's chain and its siblings): their joint law is the target chain's; a
    wrong rule is caught."""
    rng = np.random.default_rng(7)
    table = random_table(rng, V, 1.5)
    table[:, EOS] = -1e9
    target = HiddenFake(table)
    drafter = EagleDrafter(head_file(tmp_path, target, [0, 1, 2, 4]), target,
                           embeddings=rng.normal(size=(V, E)).astype(np.float32), runner=runner)
    drafted = check_target_law(monkeypatch, target, drafter, table, params, width=width, broken=broken, n_tokens=4,
                               gate=random_gates() if gated else None)
    assert drafted > (3 if width > 1 else 1 / 2 if gated else 1)  # per answer
