"""Constrained decoding: a grammar (a JSON schema, a Lark grammar) decides which tokens may come next.

The guarantee changes with it, and says so: output is distributed exactly as the *constrained* target,
p'(x) proportional to p(x) over the tokens the grammar allows after the text so far. The loop masks every
target row it verifies with (the state after the committed text and after each draft token), and masks
and renormalises the draft's rows the same way. A grammar-aware drafter draws from its masked
distribution, so it proposes only valid tokens and acceptance holds up on structured output; any other
drafter's proposal is cut at its first forbidden token (which the constrained target would reject for
certain), and the tokens before it were drawn from the masked distribution given that they are valid:
the rule stays exact either way (tests/laws/test_constraint.py checks both against the exact law).

A constraint is a small protocol (allowed / consume / rollback) with one implementation on llguidance,
whose matcher computes a token mask in microseconds and rolls back, as speculation needs.
"""

from __future__ import annotations

import json
from typing import Protocol

import numpy as np

from edgespec.errors import EdgespecError


class Constraint(Protocol):
    def allowed(self) -> np.ndarray:
        """[V] bool: the tokens allowed after what was consumed."""
        ...

    def consume(self, token: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar forbids it."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last n consumed tokens."""
        ...


class _Tokens:
    """What llguidance's TokenizerWrapper reads, from an edgespec backend (GGUF or ONNX alike)."""

    def __init__(self, backend):
        vocab = backend.vocab
        self.eos_token_id, self.bos_token_id = vocab.eos_id, vocab.bos_id
        # control tokens print nothing; llguidance marks special tokens with a leading 0xff byte
        self.special_token_ids = [i for i, (t, p) in enumerate(zip(vocab.texts, vocab.pieces, strict=True))
                                  if not p and t]
        special = set(self.special_token_ids)
        self.tokens = [b"\xff" + t if i in special else p
                       for i, (t, p) in enumerate(zip(vocab.texts, vocab.pieces, strict=True))]
        self._backend = backend

    def __call__(self, text: str) -> list[int]:
        return self._backend.tokenize(text, special=False)


def llg_tokenizer(backend):
    """An llguidance tokenizer for a backend's vocabulary (about 1 s for 49k tokens: build it once)."""
    try:
        import llguidance
    except ImportError:
        raise EdgespecError("constrained decoding needs llguidance: pip install 'edgespec[grammar]'") from None
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tokens(backend)),
                                  eos_token=sorted(backend.vocab.eog_ids))


class GrammarConstraint:
    """A constraint from a llguidance grammar; see the module docstring."""

    def __init__(self, tokenizer, grammar: str, n_vocab: int):
        import llguidance

        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise EdgespecError(f"the grammar is not usable: {self.matcher.get_error()}")
        self.n_vocab = n_vocab

    @classmethod
    def from_json_schema(cls, tokenizer, schema: dict | str, n_vocab: int) -> GrammarConstraint:
        """Output that parses as JSON valid against `schema` (a dict, JSON text, or a path to a .json file)."""
        import llguidance

        if isinstance(schema, str) and not schema.lstrip().startswith("{"):
            try:
                with open(schema) as f:
                    schema = f.read()
            except OSError as e:
                raise EdgespecError(f"cannot read the JSON schema {schema}: {e.strerror}") from None
        try:
            schema = json.loads(schema) if isinstance(schema, str) else schema
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        except (ValueError, TypeError) as e:
            raise EdgespecError(f"not a usable JSON schema: {e}") from None
        return cls(tokenizer, grammar, n_vocab)

    def allowed(self) -> np.ndarray:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.n_vocab].astype(bool)  # [V]

    def consume(self, token: int) -> bool:
        if self.matcher.is_stopped() or not self.matcher.validate_tokens([token]):
            return False
        return self.matcher.consume_token(token)

    def rollback(self, n: int) -> None:
        if n and not self.matcher.rollback(n):
            raise RuntimeError(f"llguidance could not roll back {n} tokens: {self.matcher.get_error()}")
