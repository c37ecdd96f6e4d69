"""A LlamaBackend's draft-tree passes: one pass over a tree of tokens (each branch a sequence of llama.cpp's unified
cache, sharing the cells of the nodes above it) and keeping one branch of it after verification.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.protocol import MAX_OUTPUTS, check_forward
from edgespec.errors import EdgespecError


class TreePasses:
    """forward_tree and keep_branch for LlamaBackend (backend.py), on its context, cache and pending tokens."""

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """One pass over a tree of tokens after the cache: tokens[0] (parent -1) follows the cached text, every
        other token follows its parent; each attends to the text and its own ancestors only. Returns logits
        [n, V] for every token (and their hidden states in last_hidden); the cache holds the tree until
        keep_branch keeps one branch of it.

        Leaf j's branch is sequence j + 1, which first shares the text's cells (sequence 0); a token belongs to
        the sequences of the leaves below it, at the position of its depth. Tokens the cache still owes
        (_pending) go first in the same pass, on every sequence."""
        lib, n = _lib(), len(tokens)
        check_forward(self, n, n, MAX_OUTPUTS)
        self._settle()
        if self._tree is not None:
            raise RuntimeError("keep_branch must follow forward_tree before another pass")
        depth, has_child = [], [False] * n
        for i, parent in enumerate(parents):
            if (parent < 0) != (i == 0) or parent >= i:
                raise ValueError(f"token {i} has parent {parent}: the first token is the root, nodes follow parents")
            depth.append(0 if i == 0 else depth[parent] + 1)
            if parent >= 0:
                has_child[parent] = True
        if n - sum(has_child) + 1 > self.sequences:  # a sequence per branch, and the text's
            raise EdgespecError(f"{self.name} was opened with {self.sequences} sequence(s): a draft tree of "
                                f"{n - sum(has_child)} branches needs one more than that")
        if self._pending and (self.hidden and len(self._pending) + n > MAX_OUTPUTS
                              or len(self._pending) + n > self.n_batch):
            # with embeddings on, llama.cpp outputs every row of a pass, and aborts past MAX_OUTPUTS
            self.forward([], 0)  # writes the owed tokens alone
        owed, self._pending = self._pending, []
        del self.tokens[len(self.tokens) - len(owed):]
        seqs: list[list[int]] = [[0]] + [[] for _ in range(n - 1)]  # the root also continues the text
        for seq, leaf in enumerate((i for i in range(n) if not has_child[i]), start=1):
            lib.llama_memory_seq_cp(self._mem, 0, seq, -1, -1)
            node = leaf
            while node >= 0:
                seqs[node].append(seq)
                node = parents[node]
        everyone = sorted({seq for row in seqs for seq in row})
        self._tree = (list(tokens), seqs, None)  # from here on, keep_branch or rollback clears the branches
        if self.hidden:
            lib.llama_set_embeddings(self._ctx, True)
        base = len(self.tokens)
        rows = [(tok, base + j, everyone, False) for j, tok in enumerate(owed)]
        rows += [(tok, base + len(owed) + depth[j], seqs[j], True) for j, tok in enumerate(tokens)]
        try:
            self._decode(rows)
        except EdgespecError:
            self.rollback(len(self.tokens))
            raise
        self.tokens.extend(owed)
        out = np.empty((n, self.vocab.n_vocab), dtype=np.float32)  # [n, V]
        hidden = np.empty((n, self.n_embd), dtype=np.float32) if self.hidden else None  # [n, E]
        for j in range(n):
            out[j] = np.ctypeslib.as_array(lib.llama_get_logits_ith(self._ctx, len(owed) + j),
                                           shape=(self.vocab.n_vocab,))
            if hidden is not None:
                hidden[j] = np.ctypeslib.as_array(lib.llama_get_embeddings_ith(self._ctx, len(owed) + j),
                                                  shape=(self.n_embd,))
        self._tree = (list(tokens), seqs, hidden)
        self.last_hidden = hidden
        return out

    def keep_branch(self, path: Sequence[int]) -> None:
        """After forward_tree: keep the tokens of `path` (indices from the root, path[0] == 0) after the
        cached text and drop the rest of the tree; last_hidden becomes the path's rows.

        The branch's cells stay where the tree put them only while they are the tree's first cells (the root
        and the nodes written right after it): a later token must not land in a hole before a kept cell
        (measured: llama.cpp's next pass then reads other values, 1.7 % off in the logits). The rest of the
        branch is owed (_pending): self.tokens has it, and the next pass writes it first."""
        if self._tree is None:
            raise RuntimeError("keep_branch without a tree from forward_tree")
        tokens, seqs, hidden = self._tree
        if not path or path[0] != 0:
            raise ValueError(f"a kept branch starts at the root, got {list(path)}")
        in_place = next((i for i, node in enumerate(path) if node != i), len(path))  # the root and its run
        base = len(self.tokens)
        if in_place > 1:  # the root is in sequence 0 already; the nodes after it join it from their branch
            branch = next(seq for seq in seqs[path[in_place - 1]] if seq > 0)
            _lib().llama_memory_seq_cp(self._mem, branch, 0, base + 1, base + in_place)
        self._drop_branches()
        self.tokens.extend(tokens[i] for i in path)
        self._pending = [tokens[i] for i in path[in_place:]]
        self.last_hidden = hidden[list(path)] if hidden is not None else None

    def _drop_branches(self) -> None:
        if self._tree is not None:
            n_branches = max(seq for seqs in self._tree[1] for seq in seqs)
            for seq in range(1, n_branches + 1):
                _lib().llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._tree = None
