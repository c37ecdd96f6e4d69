"""Prompt lookup's search: the tokens that followed the latest earlier occurrence of the context's last n-gram.

Where that occurrence overlaps the suffix (text repeating itself with a period shorter than k), what followed it
runs into the suffix and ends with the context; the guess it makes then applies to itself, so the proposal goes on
repeating the period (a model caught in a loop of one token or one line; the last match alone would offer one
token a round there).

`lookup` is the reference, a scan of the whole context per call. `NgramIndex` answers the same question from a
table of every n-gram's latest start, updated with the tokens appended since the last call: a few dictionary
operations a token instead of a pass over the whole context every round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def lookup(context: np.ndarray, k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Tokens that followed the most recent earlier match of the longest matching suffix n-gram."""
    n_ctx = len(context)
    if k == 0:
        return []
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [n_ctx - n, n]
        starts = np.nonzero((windows == context[-n:]).all(axis=1))[0]
        if len(starts):
            return continuation(context.tolist(), starts[-1] + n, k)
    return []


def continuation(tokens: Sequence[int], follow: int, k: int) -> list[int]:
    """k tokens from tokens[follow:], the text that followed a match, repeated with period len - follow where it
    reaches the end (token i is token i - period once tokens run out)."""
    out = list(tokens[follow:follow + k])
    period = len(tokens) - follow
    while len(out) < k:
        out.append(out[len(out) - period])
    return out


class NgramIndex:
    """`lookup` over a context that grows between calls (the loop's committed tokens).

    For each n in [min_ngram, max_ngram], starts[n] maps an n-gram to the latest start s at which it occurs with
    s + n <= len - 1 (it ends before the last token, as `lookup`'s windows over context[:-1] do). A context that
    that does not extend the one indexed is indexed again from its start."""

    def __init__(self, max_ngram: int, min_ngram: int):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.reset()

    def reset(self) -> None:
        self._context: Sequence[int] | None = None
        self._follow: tuple[int, int | None] = (-1, None)  # (length searched, where its match's continuation starts)
        self._tokens: list[int] = []  # a copy of what is indexed, to tell a grown context from another one
        self._starts: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram,
                                                                                  self.max_ngram + 1)}

    def _update(self, context: Sequence[int]) -> None:
        done, tokens = len(self._tokens), self._tokens
        grown = len(context) >= done and (not done or context[done - 1] == tokens[-1])
        if not (grown and (context is self._context or list(context[:done]) == tokens)):
            self.reset()
            done, tokens = 0, self._tokens
        self._context = context
        tokens.extend(context[done:])
        # windows ending at positions done - 1 .. len - 2 become eligible (an end at len - 1 is the suffix itself)
        for end in range(max(done - 1, 0), len(tokens) - 1):
            for n, starts in self._starts.items():
                if end + 1 >= n:
                    starts[tuple(tokens[end + 1 - n:end + 1])] = end + 1 - n

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """lookup(context, k, max_ngram, min_ngram), from the index. The loop asks several times a round (length,
        catching up, proposal or the guess it scores) about one list that only grows between resets: that list
        at the length searched last is searched once."""
        if k == 0:
            return []
        if context is not self._context or self._follow[0] != len(context):
            self._update(context)
            self._follow = (len(self._tokens), self._search())
        follow = self._follow[1]
        return [] if follow is None else continuation(self._tokens, follow, k)

    def _search(self) -> int | None:
        """Where the text that followed the latest earlier match of the longest suffix n-gram starts (None: none)."""
        tokens = self._tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = self._starts[n].get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return start + n
        return None
