"""A draft model whose vocabulary is the target's, padded or cut: its rows handed over in the target's ids.

Families round their embedding matrices up to a multiple: Qwen2.5 0.5B-3B have 151,936 tokens and 7B-72B 152,064,
the same token texts on the ids both have and unused padding after them. check_compatible calls such a pair
"padded" (sizes at most VOCAB_PADDING apart, as llama.cpp allows). PaddedDraft wraps the draft's backend so that
to the drafter and the loop it is a draft of the target's vocabulary:

- rows come back [n, V_target]: a draft with fewer ids has -inf on the ids it lacks, so its law is 0 there; a draft
  with more has its extra ids cut off, so its law is renormalised over the ids the target has (what masking them
  would give) and it never proposes an id the target lacks. The law a draft token is drawn from is the one the
  rule divides by, so the output is the target's at every temperature, as with any draft.
- it is fed the target's tokens; one the draft lacks (a padding id, which a trained target gives next to no
  probability) is read as the draft's BOS. What a draft reads changes its guesses, never the output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.backends.protocol import MAX_OUTPUTS, Backend, Vocab


class PaddedDraft(Backend):
    """`inner`, a draft backend whose vocabulary check_compatible found "padded" against `target_vocab`, with rows
    and tokens in the target's ids."""

    def __init__(self, inner: Backend, target_vocab: Vocab):
        self.inner, self.vocab = inner, target_vocab
        self.name, self.n_ctx = inner.name, inner.n_ctx
        self.n_threads, self.spins_between_runs = inner.n_threads, inner.spins_between_runs
        self.draft_vocab = inner.vocab.n_vocab
        self.tokens: list[int] = []  # the target's ids; inner.tokens holds what the draft read
        self._rows: np.ndarray | None = None  # [MAX_OUTPUTS, V_target], -inf past the draft's ids, made on first use

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        n_draft, n_target = self.draft_vocab, self.vocab.n_vocab
        fed = tokens if n_draft >= n_target or max(tokens, default=0) < n_draft else \
            [t if t < n_draft else self.inner.vocab.bos_id for t in tokens]
        rows = self.inner.forward(fed, n_logits, copy=False)  # [n_logits, V_draft]
        self.tokens.extend(tokens)
        if n_draft >= n_target:
            out = rows[:, :n_target]  # a view: each row still contiguous
            return out.copy() if copy else out
        if copy or n_logits > MAX_OUTPUTS:
            out = np.full((n_logits, n_target), -np.inf, dtype=rows.dtype)
        else:  # a buffer of ours, valid until the next forward as copy=False allows
            if self._rows is None or self._rows.dtype != rows.dtype:
                self._rows = np.full((MAX_OUTPUTS, n_target), -np.inf, dtype=rows.dtype)
            out = self._rows[:n_logits]
        out[:, :n_draft] = rows
        return out

    def rollback(self, n_past: int) -> None:
        self.inner.rollback(n_past)
        del self.tokens[n_past:]

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return self.inner.tokenize(text, special=special)

    def chat_template(self) -> str | None:
        return self.inner.chat_template()

    def memory(self) -> dict[str, int]:
        held = dict(self.inner.memory())
        held["logits"] = held.get("logits", 0) + (self._rows.nbytes if self._rows is not None else 0)
        return held

    def placement(self) -> dict:
        return self.inner.placement()

    def close(self) -> None:
        self.inner.close()
