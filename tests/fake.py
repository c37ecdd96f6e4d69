"""A table-driven fake backend: next-token logits depend only on the last token (a Markov chain).

Small enough that exact target distributions over a few tokens can be written down, and it records
every forward call so tests can check what the loop asked for. Beside it, the loop run over fakes (controller,
run, tokens_of) and a lookup drafter that counts its sources' rounds.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from edgespec.backends.protocol import Backend, Vocab
from edgespec.decode.cost import DraftController
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import LookupFirstDrafter

EOS = 0


def make_vocab(n_vocab: int, eos: int = EOS) -> Vocab:
    pieces = tuple(b"<eos>" if i == eos else bytes([ord("a") + i % 26]) for i in range(n_vocab))
    return Vocab(texts=pieces, pieces=tuple(b"" if i == eos else p for i, p in enumerate(pieces)),
                 bos_id=eos, eos_id=eos, eog_ids=frozenset([eos]))


class FakeBackend(Backend):
    trees = True  # forward_tree, keep_branch

    def __init__(self, table: np.ndarray, *, n_ctx: int = 256, vocab: Vocab | None = None, name: str = "fake"):
        self.table = np.asarray(table, dtype=np.float64)  # [V, V]: row = last token, values = next logits
        self.vocab = vocab or make_vocab(self.table.shape[0])
        self.n_ctx = n_ctx
        self.name = name
        self.tokens: list[int] = []
        self.calls: list[tuple[int, int]] = []  # (tokens fed, logits rows asked)

    def forward(self, tokens, n_logits, *, copy=True):  # always a new array
        assert 0 <= n_logits <= len(tokens)
        assert len(self.tokens) + len(tokens) <= self.n_ctx, "the loop overflowed the context"
        self.calls.append((len(tokens), n_logits))
        self.tokens.extend(tokens)
        last = self.tokens[len(self.tokens) - n_logits:] if n_logits else []
        return self.table[last]  # [n_logits, V]

    def forward_tree(self, tokens, parents):
        """Rows for a draft tree (a Markov chain's row depends on the node's token alone)."""
        assert len(self.tokens) + len(tokens) <= self.n_ctx, "the loop overflowed the context"
        assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i), parents
        self.calls.append((len(tokens), len(tokens)))
        self.tree = list(tokens)
        return self.table[self.tree]  # [n, V]

    def keep_branch(self, path):
        assert path[0] == 0
        self.tokens.extend(self.tree[i] for i in path)
        self.tree = None

    def rollback(self, n_past):
        assert 0 <= n_past <= len(self.tokens)
        del self.tokens[n_past:]

    def tokenize(self, text, *, special):
        return [ord(c) - ord("a") + 1 for c in text]

    def chat_template(self):
        return "{% for m in messages %}{{ m['content'] }}{% endfor %}"

    def memory(self):
        return {"weights": self.table.nbytes, "kv_cache": 0}


def random_table(rng: np.random.Generator, n_vocab: int, sharpness: float = 2.0) -> np.ndarray:
    """Random next-token logits [V, V]."""
    return rng.normal(scale=sharpness, size=(n_vocab, n_vocab))


def deterministic_table(next_token: dict[int, int], n_vocab: int) -> np.ndarray:
    """A chain that always moves from token a to next_token[a] (others: to token 1)."""
    table = np.full((n_vocab, n_vocab), -30.0)
    for a in range(n_vocab):
        table[a, next_token.get(a, 1)] = 30.0
    return table


GREEDY = SamplingParams(temperature=0)


def controller(k_max=4):
    return DraftController({n: 1.0 for n in range(1, 17)}, draft_cost=0.01, k_max=k_max)


def run(target, drafter, prompt, *, max_tokens=20, draft_max=None, params=GREEDY, seed=0, stop=()):
    stats = Stats()
    events = list(speculate(target, drafter, controller(), prompt, params, np.random.default_rng(seed),
                            max_tokens=max_tokens, stop=stop, draft_max=draft_max, stats=stats))
    return events, stats


def tokens_of(events):
    return [e.token for e in events if e.token is not None]


class Sources(LookupFirstDrafter):
    """A LookupFirstDrafter that counts the rounds each source drafted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds = Counter()

    def propose(self, context, k, params, rng, **options):
        tokens, probs = super().propose(context, k, params, rng, **options)
        self.rounds["lookup" if self.last_free else "inner"] += bool(tokens)
        return tokens, probs
