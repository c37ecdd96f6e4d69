"""The backend contract: what the speculative loop needs from a model runtime, and nothing more.

A backend owns one model and one KV cache holding `tokens`. `forward` appends tokens to the cache and
returns logits only for the last `n_logits` of them (a verify pass needs k+1 rows, a draft step one,
a prefill none), so no backend ever holds an n_ctx x n_vocab buffer. `rollback(n)` truncates the cache
to its first n tokens. Third-party runtimes are imported only in their adapter modules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgespec.errors import EdgespecError

MAX_OUTPUTS = 16  # the most logits rows one forward may ask for: a verify pass of 15 drafts + 1


@dataclass(frozen=True)
class Vocab:
    """Facts about a vocabulary that decide whether two models can form a pair."""

    texts: tuple[bytes, ...] = field(repr=False)  # token id -> its string in the vocabulary
    pieces: tuple[bytes, ...] = field(repr=False)  # token id -> bytes it prints (control tokens: b"")
    bos_id: int
    eos_id: int
    eog_ids: frozenset[int]  # every id that ends generation (EOS, EOT, <|im_end|>, ...)

    @property
    def n_vocab(self) -> int:
        return len(self.texts)

    @property
    def digest(self) -> str:
        """A short hash of the token texts, for manifests and messages."""
        return hashlib.sha256(b"\0".join(self.texts)).hexdigest()[:16]


# how many tokens a draft's vocabulary may have more or fewer than the target's: the padding rows a family's models
# were rounded up to (Qwen2.5 0.5B-3B have 151,936 tokens, 7B-72B 152,064), llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_PADDING = 128


def check_compatible(target: Vocab, draft: Vocab, *, padding: int = VOCAB_PADDING) -> str:
    """How a draft's vocabulary relates to the target's: "exact" (the same tokens) or "padded" (the same tokens on
    the ids both have, and at most `padding` ids more or fewer, which the draft never proposes or never has:
    backends/padded.py). Raise EdgespecError naming the first difference otherwise: sizes further apart, another BOS
    or EOS, other end-of-generation ids, or another token text on an id both have."""
    if abs(target.n_vocab - draft.n_vocab) > padding:
        raise EdgespecError(
            f"draft vocabulary has {draft.n_vocab} tokens but the target's has {target.n_vocab}: "
            f"more than {padding} apart, so not the target's tokenizer padded"
        )
    for name in ("bos_id", "eos_id"):
        if getattr(target, name) != getattr(draft, name):
            raise EdgespecError(
                f"draft {name} is {getattr(draft, name)} but the target's is {getattr(target, name)}: "
                "the draft must share the target's tokenizer"
            )
    shared = min(target.n_vocab, draft.n_vocab)
    target_eog = {i for i in target.eog_ids if i < shared}
    draft_eog = {i for i in draft.eog_ids if i < shared}
    if target_eog != draft_eog:
        raise EdgespecError(
            f"draft end-of-generation ids {sorted(draft_eog)} differ from the target's "
            f"{sorted(target_eog)}: the draft must share the target's tokenizer"
        )
    if target.texts[:shared] != draft.texts[:shared]:
        i = next(i for i, (a, b) in enumerate(zip(target.texts, draft.texts, strict=False)) if a != b)
        raise EdgespecError(
            f"draft token {i} is {draft.texts[i]!r} but the target's is {target.texts[i]!r}: "
            "the draft must share the target's tokenizer"
        )
    return "exact" if target.n_vocab == draft.n_vocab else "padded"


class Backend:
    """What the speculative loop needs from a model runtime. A backend subclasses this: the first five methods are
    required; the abilities below them are declared here with what a backend without them does, so the loop and
    the drafters ask a backend (`target.trees`, `target.prefetch(...)`) instead of probing it."""

    name: str  # a label for messages and stats, e.g. the file name
    vocab: Vocab
    n_ctx: int
    tokens: list[int]  # what the KV cache holds, in order

    hidden: bool = False  # forward keeps the final hidden state of each returned row in last_hidden (draft heads)
    last_hidden: np.ndarray | None = None  # [n_logits, n_embd] of the last forward, where hidden
    trees: bool = False  # forward_tree and keep_branch: a draft tree verified in one pass
    n_threads: int | None = None  # CPU threads the backend runs on, where it says
    spins_between_runs: bool = True  # its threads keep the cores between passes (onnxruntime may stop them)

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        """Append tokens to the cache; return logits [n_logits, V] for the last n_logits of them. copy=False
        allows a read-only view of the backend's own buffer, valid until its next forward (a caller that reads
        the rows before then saves a copy of them; backends without such a buffer return a new array)."""
        raise NotImplementedError

    def rollback(self, n_past: int) -> None:
        """Truncate the cache to its first n_past tokens."""
        raise NotImplementedError

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Text to ids; with special, the vocabulary's BOS is added (if it wants one) and special
        token texts such as <|im_end|> parse as their ids."""
        raise NotImplementedError

    def chat_template(self) -> str | None:
        """The Jinja chat template from the model's metadata, if it has one."""
        return None

    def memory(self) -> dict[str, int]:
        """Bytes held: at least `weights` and `kv_cache`."""
        raise NotImplementedError

    def placement(self) -> dict:
        """Where the model runs: its runtime and device (and, for llama.cpp, the layers on a GPU)."""
        return {"runtime": self.name, "device": "cpu"}

    def prefetch(self, tokens: Sequence[int]) -> bool:
        """Start a one-row forward of tokens without waiting for it (collect returns its rows); False, and
        nothing done, where the backend cannot overlap a pass with the caller's work."""
        return False

    def collect(self) -> np.ndarray:
        """The rows [1, V] of the pass prefetch started."""
        raise RuntimeError(f"{self.name} never starts a pass ahead: collect without prefetch")

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Where `trees`: one pass over a draft tree (tokens[i] follows tokens[parents[i]]), rows [n, V]."""
        raise NotImplementedError(f"{self.name} verifies chains only")

    def keep_branch(self, path: Sequence[int]) -> None:
        """Where `trees`: keep the tree's nodes on `path` in the cache, drop the rest."""
        raise NotImplementedError(f"{self.name} verifies chains only")

    def keep_states(self, cache) -> bool:
        """Save and restore sequence states in `cache` (a backends.llama.states.PromptCache; None: stop) from now
        on: recall does something. False where the backend cannot (ONNX)."""
        return False

    def recall(self, tokens: Sequence[int], common: int) -> int:
        """Before the cache is made to hold `tokens` (sync), of whose first tokens it holds `common`: a backend that
        keeps saved states (llama.cpp's, backends/llama/states.py) saves a long part it is about to drop and puts
        in its place a saved state that holds more of `tokens`. Returns how many of `tokens` the cache holds now."""
        return common

    def close(self) -> None:
        """Release the model and its cache; the backend is unusable afterwards."""


def check_forward(backend: Backend, n_tokens: int, n_logits: int, max_outputs: int) -> None:
    """The argument rules every backend's forward enforces, in one place."""
    if not 0 <= n_logits <= min(n_tokens, max_outputs):
        raise ValueError(f"n_logits={n_logits} for {n_tokens} tokens (at most {max_outputs})")
    if len(backend.tokens) + n_tokens > backend.n_ctx:
        raise EdgespecError(f"{len(backend.tokens) + n_tokens} tokens do not fit the context of {backend.n_ctx}")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if len(diff) else n


def forward_rows(backend: Backend, tokens: Sequence[int]) -> Iterator[np.ndarray]:
    """Feed `tokens` after the cache with every row of logits out (row i: the guess at the token after tokens[i]),
    MAX_OUTPUTS tokens a pass, which every backend's output cap allows: yields rows [<=MAX_OUTPUTS, V] per pass.
    What teacher-forced passes (agreement, calibration, parity, corpora) are made of."""
    for start in range(0, len(tokens), MAX_OUTPUTS):
        chunk = tokens[start:start + MAX_OUTPUTS]
        yield backend.forward(chunk, len(chunk))


def reuse(backend: Backend, tokens: Sequence[int], n_logits: int = 0) -> int:
    """Make the cache hold the longest prefix of `tokens` it has (cached, or a saved state's: recall), short of
    the last n_logits tokens; returns that prefix's length. All rollback arithmetic lives here."""
    keep = min(backend.recall(tokens, common_prefix(backend.tokens, tokens)), len(tokens) - n_logits)
    # always truncate: after an interrupted forward the cache may hold more than `tokens` says
    backend.rollback(keep)
    return keep


def sync(backend: Backend, tokens: Sequence[int], n_logits: int) -> np.ndarray:
    """Make the cache hold exactly `tokens`, reusing the longest prefix it has (reuse). Returns logits for the last
    n_logits tokens; at least that many are re-run even when cached, since a cache keeps no logits."""
    keep = reuse(backend, tokens, n_logits)
    return backend.forward(tokens[keep:], n_logits)
