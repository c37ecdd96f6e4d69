"""A draft model with another tokenizer: token-level intersection (TLI, Timor et al., ICML 2025).

A draft whose vocabulary is not the target's (nor the target's padded: check_compatible) can still draft exactly.
`VocabMap`, built once per pair, pairs every draft token with the target token that spells the same bytes (control
tokens by their text: ChatML's <|im_start|> in both). `CrossDrafter` then

- reads the target's committed text in its own tokens: the target tokens' bytes (control tokens by their text, where
  the draft has such a token) from a fixed start (a window that jumps forward by half when the text outgrows it,
  as ModelDrafter's does, so the draft's cache is reused between rounds), tokenized by the draft's tokenizer: the
  last few tokens of the last reading again with what the text gained (a BPE merge may join them), the whole
  window where its tokens do not spell the text byte for byte (a SentencePiece prefix space). Its cost is part
  of the draft's, which the controller prices. Where the text ends inside a UTF-8 character it does not draft;
- drafts from its law restricted to the tokens in the intersection, renormalised and handed over as a row in the
  target's ids (-inf outside), drawn from there and fed back to the draft as its own token.

The law each draft token is drawn from is that restricted law over the target's ids, and it is what the rejection
rule divides by, so the output is the target's at every temperature, whatever the draft reads or how well the two
tokenizations agree. Tokens outside the intersection cost acceptance, never correctness: `intersection_mass`
reports the share of the draft's probability they leave inside (measured at one proposal's first step in 16).

With text_mode (the target's tokenizer), rounds at t = 0 draft string-level instead (SLEM, the same paper): the
draft writes its own greedy tokens, any of them, and the target's spelling of that text is proposed with
probability 1 each, as prompt lookup's tokens are. Measured on the reference pair it did no better than the
intersection (docs/results/2026-11-27-cross-tokenizer.md), so the loader leaves it off.
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
RETOKENIZE = 8  # tokens at the end of the last reading that are read again with what the text gained
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
        # what each target token adds to the text the draft reads: a control token only where the draft has one of
        # its text (a target's <|begin_of_text|> would be junk text to another family's draft)
        self._pieces = [_spelled(target_vocab, i) if target_vocab.pieces[i] or self.map.target_to_draft[i] >= 0
                        else b"" for i in range(target_vocab.n_vocab)]
        self._draft_bytes = [_spelled(backend.vocab, i) for i in range(backend.vocab.n_vocab)]
        self._incremental = True  # the draft's tokenizer spells text piece by piece (checked on every reading)
        self.mass_sum, self.mass_steps, self._proposals = 0.0, 0, 0  # over every text since load
        self.reset()

    def reset(self) -> None:
        self._text = bytearray()  # the committed text's bytes from the first target token on
        self._seen = 0  # target tokens in _text
        self._context: list[int] | None = None  # the target tokens _text was read from (a prefix of the next)
        self._start = 0  # byte where the draft's window starts
        self._tokens: list[int] = []  # the draft's tokens for the window as last read
        self._ends: list[int] = []  # the byte (from the window's start) where each ends
        self._read: list[int] | None = None  # what draft_tokens answered last

    def vocabulary(self) -> dict:
        """How its vocabulary pairs with the target's, for placements: the tokens shared, and the draft's mass on
        them."""
        return {"vocabulary": self.pairing, "shared_tokens": self.map.shared,
                "intersection_mass": round(self.intersection_mass, 4)}

    @property
    def intersection_mass(self) -> float:
        """The draft's probability mass inside the intersection, averaged over the proposals measured since load
        (1.0 before any)."""
        return self.mass_sum / self.mass_steps if self.mass_steps else 1.0

    def draft_tokens(self, context: list[int]) -> list[int] | None:
        """The draft's tokens for the committed text's window (None where it ends inside a UTF-8 character)."""
        if context is self._context and len(context) == self._seen:
            return self._read  # asked again in the round (catching up, then proposing)
        # the loop's committed list only grows within a generation; another list is compared with what was read
        if len(context) < self._seen or context is not self._context and (
                self._context is None or context[:self._seen] != self._context[:self._seen]):
            self._text, self._seen, self._start, self._tokens, self._ends = bytearray(), 0, 0, [], []
        self._context = context
        for token in context[self._seen:]:
            self._text += self._pieces[token]
        self._seen = len(context)
        while True:
            if len(self._text) - self._start > self.window:  # jump to a line or word break half a window back
                cut = len(self._text) - self.window // 2
                brk = max(self._text.rfind(b"\n", self._start, cut), self._text.rfind(b" ", self._start, cut))
                start = brk + 1 if brk >= self._start else cut
                while start < len(self._text) and self._text[start] & 0xC0 == 0x80:  # not inside a character
                    start += 1
                self._start, self._tokens, self._ends = start, [], []
            if _complete(self._text) < len(self._text):
                self._read = None
                return None
            self._read = self._retokenize()
            if len(self._read) + MAX_DRAFT <= self.backend.n_ctx or self.window < 64:
                return self._read
            self.window //= 2  # a text of more tokens a byte than the window assumed: read less of it
            self._tokens, self._ends = [], []

    def _retokenize(self) -> list[int]:
        """The window's text in the draft's tokens: the tokens read last time but the last few kept, the rest of the
        text tokenized on from where they end (a BPE merge may join the end of what was read with what came);
        the whole window where the tokenizer does not spell text piece by piece (a SentencePiece prefix space)."""
        window = bytes(self._text[self._start:])
        keep = len(self._tokens) - RETOKENIZE if self._incremental else 0
        if keep > 0:
            offset = self._ends[keep - 1]
            try:
                tail = self._spell(window[offset:].decode("utf-8"), offset)
            except UnicodeDecodeError:  # the kept tokens end inside a character (a byte-level token's half)
                tail = None
            if tail is not None and tail[1] is not None:
                self._tokens[keep:], self._ends[keep:] = tail
                return self._tokens
        self._tokens, self._ends = self._spell(window.decode("utf-8"), 0)
        if self._ends is None:  # the tokens do not spell the text byte for byte: read the whole window every time
            self._incremental, self._ends = False, []
        return self._tokens

    def _spell(self, text: str, offset: int) -> tuple[list[int], list[int] | None]:
        """text in the draft's tokens (no BOS where it goes on from offset > 0) and the byte where each ends (None
        where those tokens' bytes are not the text's)."""
        tokens = self.backend.tokenize(text, special=True)
        bos = self.backend.vocab.bos_id
        added = bool(tokens) and tokens[0] == bos and not text.encode("utf-8").startswith(self._draft_bytes[bos])
        if added and offset:  # a BOS the tokenizer puts before a text: this one goes on from another
            tokens = tokens[1:]
        ends, end = [], offset
        for i, t in enumerate(tokens):
            end += 0 if added and i == 0 else len(self._draft_bytes[t])
            ends.append(end)
        return tokens, (ends if end - offset == len(text.encode("utf-8")) else None)

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


def _spelled(vocab: Vocab, token: int) -> bytes:
    """A token's bytes in text: what it prints, or a control token's text (<|im_start|>), which a tokenizer
    reading special texts parses as that token."""
    return vocab.pieces[token] or vocab.texts[token]


def _complete(data: bytes) -> int:
    """The length of data's longest prefix that ends on a whole UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 != 0x80:  # the last character's first byte
            width = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
            return len(data) if width <= back else len(data) - back
    return len(data)
