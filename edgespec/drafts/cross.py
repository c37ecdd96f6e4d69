"""A draft model with another tokenizer: token-level intersection (TLI, Timor et al., ICML 2025).

A draft whose vocabulary is not the target's (nor the target's padded: check_compatible) can still draft exactly.
`VocabMap`, built once per pair, pairs every draft token with the target token that spells the same bytes (control
tokens by their text: ChatML's <|im_start|> in both). `CrossDrafter` then

- reads the target's committed text in its own tokens: the target tokens' bytes from a fixed start (a window that
  jumps forward by half when the text outgrows it, as ModelDrafter's does, so the draft's cache is reused between
  rounds), tokenized by the draft's tokenizer; the whole window again each round, since a BPE or SentencePiece
  tokenization of a tail is not the tail of the text's (its cost is part of the draft's, which the controller
  prices). Where the text ends inside a UTF-8 character, it does not draft that round;
- drafts from its law restricted to the tokens in the intersection, renormalised and handed over as a row in the
  target's ids (-inf outside), drawn from there and fed back to the draft as its own token.

The law each draft token is drawn from is that restricted law over the target's ids, and it is what the rejection
rule divides by, so the output is the target's at every temperature, whatever the draft reads or how well the two
tokenizations agree. Tokens outside the intersection cost acceptance, never correctness: `intersection_mass`
reports the share of the draft's probability they leave inside (measured at one proposal's first step in 16).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from edgespec.backends.protocol import Backend, Vocab, common_prefix, sync
from edgespec.decode.laws import NoLaw, law
from edgespec.drafts.base import CATCH_UP_LAG, MAX_DRAFT, Drafter, confidence, draw
from edgespec.errors import EdgespecError

WINDOW_BYTES = 4096  # the committed text a draft reads at most: its tail, from a start that jumps by half
MIN_SHARED = 0.5  # below this share of the draft's tokens in the intersection, a draft cannot pay: refused
MEASURE_EVERY = 16  # proposals per measurement of the draft's mass inside the intersection (a pass over its row)
_BYTE_TOKEN = re.compile(rb"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's byte fallback: the same bytes as a real token


def _spellings(vocab: Vocab) -> list[bytes | None]:
    """Per id the key two vocabularies are matched by: the bytes a token prints, a control token's text (its
    piece is empty), None for a token with neither."""
    out: list[bytes | None] = []
    for text, piece in zip(vocab.texts, vocab.pieces, strict=True):
        out.append(piece if piece else (b"\0" + text if text else None))  # \0: a control text never equals bytes
    return out


class VocabMap:
    """The token-level intersection of a draft's vocabulary and a target's: draft_ids [S] and target_ids [S], the
    pairs of ids that spell the same bytes, ordered by target id; draft_to_target [V_draft] (-1: no such token).
    Where several target tokens spell the same bytes (SentencePiece's <0x41> beside "A"), the one that is not a
    byte fallback, else the lowest id."""

    def __init__(self, target: Vocab, draft: Vocab):
        by_spelling: dict[bytes, int] = {}
        for i, key in enumerate(_spellings(target)):
            if key is None:
                continue
            held = by_spelling.get(key)
            if held is None or (_BYTE_TOKEN.fullmatch(target.texts[held]) and not _BYTE_TOKEN.fullmatch(
                    target.texts[i])):
                by_spelling[key] = i
        self.draft_to_target = np.full(draft.n_vocab, -1, dtype=np.int64)
        for i, key in enumerate(_spellings(draft)):
            if key is not None and key in by_spelling:
                self.draft_to_target[i] = by_spelling[key]
        draft_ids = np.flatnonzero(self.draft_to_target >= 0)
        # two draft tokens of one spelling (a byte fallback and a real token) would share a target id: keep one
        targets, first = np.unique(self.draft_to_target[draft_ids], return_index=True)
        self.draft_ids, self.target_ids = draft_ids[first], targets  # [S], ascending target ids
        self.target_to_draft = np.full(target.n_vocab, -1, dtype=np.int64)
        self.target_to_draft[self.target_ids] = self.draft_ids
        self.n_target, self.n_draft = target.n_vocab, draft.n_vocab

    @property
    def shared(self) -> int:
        return len(self.target_ids)

    def to_target(self, logits: np.ndarray, out: np.ndarray) -> np.ndarray:
        """A draft row of logits [V_draft] as a row over the target's ids [V_target] in `out` (-inf outside the
        intersection, which stays so between calls)."""
        out[self.target_ids] = logits[self.draft_ids]
        return out


class CrossDrafter(Drafter):
    """A draft model with a tokenizer of its own (see the module docstring). `backend` holds the draft model;
    the target's vocabulary gives the text of what the loop commits."""

    def __init__(self, backend: Backend, target_vocab: Vocab, *, window: int = WINDOW_BYTES,
                 text_mode: Callable[[str], list[int]] | None = None):
        """text_mode: the target's tokenizer, for string-level drafting (see propose_text) at t = 0; None: token-level
        intersection at every temperature."""
        self.backend, self.target_vocab, self.window = backend, target_vocab, window
        self.target_tokenize = text_mode
        # token-level: a gate reads the restricted row (a function of the position); a string-level draft writes k
        self.gated = text_mode is None
        self.map = VocabMap(target_vocab, backend.vocab)
        share = self.map.shared / backend.vocab.n_vocab
        if share < MIN_SHARED:
            raise EdgespecError(
                f"draft {backend.name} has another tokenizer, and only {self.map.shared} of its "
                f"{backend.vocab.n_vocab} tokens ({share:.0%}) spell a token of the target's: too few to draft with")
        self.name = f"cross:{backend.name}"
        self.pairing = "cross-tokenizer"
        self._row = np.full(target_vocab.n_vocab, -np.inf, dtype=np.float32)  # [V_target], -inf off the map
        self._pieces = [_context_bytes(target_vocab, i) for i in range(target_vocab.n_vocab)]
        self.mass_sum, self.mass_steps, self._proposals = 0.0, 0, 0  # over every text since load
        self.reset()

    def reset(self) -> None:
        self._text = bytearray()  # the committed text's bytes from the first target token on
        self._seen = 0  # target tokens in _text
        self._context: list[int] | None = None  # the target tokens _text was read from (a prefix of the next)
        self._start = 0  # byte where the draft's window starts

    @property
    def intersection_mass(self) -> float:
        """The draft's probability mass inside the intersection, averaged over the proposals measured since load
        (1.0 before any)."""
        return self.mass_sum / self.mass_steps if self.mass_steps else 1.0

    def draft_tokens(self, context: list[int]) -> list[int] | None:
        """The draft's tokens for the committed text's window (None where it ends inside a UTF-8 character)."""
        # the loop's committed list only grows within a generation; another list is compared with what was read
        if len(context) < self._seen or context is not self._context and (
                self._context is None or context[:self._seen] != self._context[:self._seen]):
            self._text, self._seen, self._start = bytearray(), 0, 0
        self._context = context
        for token in context[self._seen:]:
            self._text += self._pieces[token]
        self._seen = len(context)
        while True:
            if len(self._text) - self._start > self.window:  # jump to a line or word break half a window back
                cut = len(self._text) - self.window // 2
                brk = max(self._text.rfind(b"\n", self._start, cut), self._text.rfind(b" ", self._start, cut))
                self._start = brk + 1 if brk >= self._start else cut
            try:
                text = self._text[self._start:].decode("utf-8")
            except UnicodeDecodeError:
                return None
            tokens = self.backend.tokenize(text, special=True)
            if len(tokens) + MAX_DRAFT <= self.backend.n_ctx or self.window < 64:
                return tokens
            self.window //= 2  # a text of more tokens a byte than the window assumed: read less of it

    def catch_up(self, context: list[int]) -> None:
        seen = self.draft_tokens(context)
        if seen and len(seen) - common_prefix(self.backend.tokens, seen) > CATCH_UP_LAG:
            sync(self.backend, seen[:-1], 0)

    def propose(self, context, k, params, rng, constraint=None, gate=None):
        if self.target_tokenize is not None and params.greedy and constraint is None:
            return self.propose_text(context, k)
        seen = self.draft_tokens(context)
        k = min(k, self.backend.n_ctx - len(seen)) if seen else 0
        if k <= 0:
            return [], []
        logits = sync(self.backend, seen, 1)[0]  # [V_draft]
        self._proposals += 1
        if self._proposals % MEASURE_EVERY == 1:
            self._measure(logits, params)
        tokens, laws = [], []
        eog = self.target_vocab.eog_ids
        while True:
            row = self.map.to_target(logits, self._row)  # [V_target]
            try:
                row_law = law(row, params)
            except NoLaw:  # nothing of the intersection is possible here: the chain ends
                break
            if gate is not None and not gate.keep(confidence(row)):
                break
            token = draw(row_law, rng)
            tokens.append(token)
            laws.append(row_law)
            if len(tokens) == k or token in eog:
                break
            if gate is not None and not gate.go_on():
                break
            logits = self.backend.forward([int(self.map.target_to_draft[token])], 1, copy=False)[0]
        return tokens, laws

    def propose_text(self, context: list[int], k: int) -> tuple[list[int], None]:
        """String-level drafting (SLEM, Timor et al.): the draft writes up to k tokens of its own greedily, any of
        its tokens, and the target's tokenizer spells that text in target tokens, proposed as prompt lookup's are,
        with probability 1 each: a function of the context alone, so exact at any temperature (used at t = 0,
        where it keeps what the intersection loses: words the two vocabularies split differently)."""
        seen = self.draft_tokens(context)
        k = min(k, self.backend.n_ctx - len(seen)) if seen else 0
        own: list[int] = []
        if k > 0:
            logits = sync(self.backend, seen, 1)[0]  # [V_draft]
            eog = self.backend.vocab.eog_ids
            while True:
                token = int(np.argmax(logits))
                if token in eog:
                    break
                own.append(token)
                if len(own) == k:
                    break
                logits = self.backend.forward([token], 1, copy=False)[0]
        text = b"".join(self.backend.vocab.pieces[t] for t in own)
        text = text[:_complete(text)].decode("utf-8")
        return (self.target_tokenize(text)[:k] if text else []), None

    def _measure(self, logits: np.ndarray, params) -> None:
        """The share of the draft's softmax mass (at the sampling temperature; 1 where greedy picks inside)
        that falls inside the intersection."""
        if params.greedy:
            inside = float(self.map.draft_to_target[int(np.argmax(logits))] >= 0)
        else:
            w = np.exp((logits - logits.max()) / np.float32(params.temperature))
            inside = float(w[self.map.draft_ids].sum() / w.sum())
        self.mass_sum += inside
        self.mass_steps += 1


def _context_bytes(vocab: Vocab, token: int) -> bytes:
    """What a target token adds to the text a cross-tokenizer draft reads: its bytes, or a control token's text
    (<|im_start|>, which the draft's tokenizer parses as its own special token where it has one); nothing for BOS."""
    if token == vocab.bos_id:
        return b""
    return vocab.pieces[token] or vocab.texts[token]


def _complete(data: bytes) -> int:
    """The length of data's longest prefix that ends on a whole UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 != 0x80:  # the last character's first byte
            width = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
            return len(data) if width <= back else len(data) - back
    return len(data)
