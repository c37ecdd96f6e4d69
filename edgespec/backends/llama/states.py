"""Saved sequence states in host memory: a prompt read once is not read again when its conversation comes back.

A server's slots hold the conversations they last answered; a new conversation takes a slot and its cache is
overwritten, so the old conversation's next turn would read its whole prefix again (at 4 slots and 8 clients,
every turn). Before a backend drops PROMPT_TOKENS or more of a sequence's cache, `PromptCache` saves the sequence's
state (llama_state_seq_get_data: its cells' positions and K/V rows, 23 KB a token for SmolLM2-135M in f16) under the
tokens it holds; when a prompt arrives, the saved state that shares the longest prefix with it is copied into the
sequence (llama_state_seq_set_data, into any sequence of the same context) where it spares reading enough of the
prompt to pay for the copy (GAIN_TOKENS, COPY_SHARE), and only the rest is read. A 730-token prompt on 2 cores:
read in 0.96 s, its 17 MB state saved in 2 ms and copied in in 1.1 ms (experiments/prompt_cache_copy.py). This is
llama-server's host-memory prompt cache (`--cache-ram`).

States are kept within `capacity` bytes, the least recently used dropped first; a state whose tokens lead another
one's is dropped for the longer. A target's and its draft model's states share one cache, each restored only into
its own context (`owner`). Backends call `recall` from `sync` (backends/protocol.py) before they roll back.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.protocol import MAX_OUTPUTS, common_prefix
from edgespec.errors import EdgespecError

# a sync that drops or lacks fewer tokens than this is a decoding round's (a pass carries at most MAX_OUTPUTS rows),
# not a new prompt's: it saves nothing and looks for nothing
PROMPT_TOKENS = 2 * MAX_OUTPUTS
# a saved state is copied in where it spares reading GAIN_TOKENS or more and a COPY_SHARE-th of its own tokens:
# copying a state costs 1/570 to 1/1000 of reading its tokens on a CPU (141 to 1,500 tokens: 0.3 ms against
# 0.18 s, 2.3 ms against 2.3 s; experiments/prompt_cache_copy.py), and by estimate, not measured, a 20th on a GPU
# (a 7B model's 2,000-token state, 115 MB over PCIe, against its prefill)
GAIN_TOKENS = 4
COPY_SHARE = 32
DEFAULT_BYTES = 1 << 30  # "auto": at most this much, and no more than a quarter of the memory available


@dataclass(eq=False)  # states are told apart by identity
class _State:
    owner: object  # the context it was saved from (a LlamaBackend or a SharedContext)
    tokens: np.ndarray  # [n] int32: what the sequence held
    data: np.ndarray  # [size] uint8: llama_state_seq_get_data's bytes


class PromptCache:
    """Saved sequence states, at most `capacity` bytes of them (see the module docstring)."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise EdgespecError(f"the prompt cache cannot hold {capacity} bytes")
        self.capacity = capacity
        self._states: list[_State] = []  # least recently used first
        self._lock = threading.Lock()  # a target's and a draft's contexts save into one cache; stats() reads it
        self.saved = self.restored = self.failed = 0
        self.restored_tokens = 0  # prompt tokens not read again

    @property
    def used(self) -> int:
        return sum(s.data.nbytes for s in self._states)

    def __len__(self) -> int:
        return len(self._states)

    def stats(self) -> dict:
        """What /health and /metrics report (read from the server's event loop while streams save and restore)."""
        with self._lock:
            return {"capacity_bytes": self.capacity, "bytes": self.used, "states": len(self), "saved": self.saved,
                    "restored": self.restored, "restored_tokens": self.restored_tokens, "failed": self.failed}

    def worth(self, cached: int, wanted: int, common: int) -> bool:
        """Whether a sequence holding `cached` tokens, asked for `wanted` of which it holds the first `common`,
        drops or lacks enough for the cache to matter (the check on every sync: most drop a rejected draft or add
        the tokens a round accepted)."""
        return self.capacity > 0 and max(cached, wanted) - common >= PROMPT_TOKENS

    def recall(self, owner, ctx, mem, seq: int, cached: Sequence[int], tokens: Sequence[int],
               common: int) -> list[int] | None:
        """Sequence `seq` of llama.cpp context `ctx` (its memory `mem`) holds `cached`, of which `tokens` starts with
        the first `common`: save its state if it is about to drop PROMPT_TOKENS or more, and copy in the saved state
        that holds the most of `tokens`, where copying it pays (GAIN_TOKENS, COPY_SHARE). Returns what the
        sequence holds then (all of the saved state's tokens, more than `tokens` asks for where it went on), or
        None where it is unchanged; [] where a state could not be copied in (llama.cpp found no room: the caller
        reads the prompt, as without a cache)."""
        with self._lock:
            if len(cached) - common >= PROMPT_TOKENS:
                self._save(owner, ctx, seq, cached)
            best, most = None, common
            for state in self._states:
                if state.owner is owner and len(state.tokens) > most:
                    n = common_prefix(state.tokens, tokens)
                    if n > most:
                        best, most = state, n
            gain = most - common
            if best is None or gain < GAIN_TOKENS or gain * COPY_SHARE < len(best.tokens):
                return None
            lib = _lib()
            lib.llama_memory_seq_rm(mem, seq, -1, -1)
            data = best.data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            if lib.llama_state_seq_set_data(ctx, data, best.data.nbytes, seq) != best.data.nbytes:
                lib.llama_memory_seq_rm(mem, seq, -1, -1)  # whatever part got in
                self.failed += 1
                return []
            self._states.remove(best)
            self._states.append(best)
            self.restored += 1
            self.restored_tokens += gain
            return best.tokens.tolist()

    def _save(self, owner, ctx, seq: int, cached: Sequence[int]) -> None:
        tokens = np.asarray(cached, dtype=np.int32)
        for state in self._states:
            if state.owner is owner and _leads(tokens, state.tokens):
                self._states.remove(state)  # held already (the state this one was restored from, or a longer one)
                self._states.append(state)
                return
        lib = _lib()
        size = lib.llama_state_seq_get_size(ctx, seq)
        if size > self.capacity:
            return
        # the states this one continues are dropped for it; then the least recently used, until it fits
        self._states = [s for s in self._states if not (s.owner is owner and _leads(s.tokens, tokens))]
        used = self.used
        while self._states and used + size > self.capacity:
            used -= self._states.pop(0).data.nbytes
        data = np.empty(size, dtype=np.uint8)
        if lib.llama_state_seq_get_data(ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq) != size:
            return
        self._states.append(_State(owner, tokens, data))
        self.saved += 1


def _leads(short: np.ndarray, long: np.ndarray) -> bool:
    """Whether `long` starts with `short`."""
    return len(short) <= len(long) and common_prefix(short, long) == len(short)


def prompt_cache_bytes(asked: str | int | None, plan=None) -> int:
    """The bytes a prompt cache may hold. asked: a size ('512MiB', bytes; 0: no cache) or None / 'auto': up to
    DEFAULT_BYTES, no more than a quarter of the memory available now, and, where a memory plan counts host memory
    (a CPU, or a GPU sharing it), no more than the plan leaves of its budget. A size asked for that the plan's
    budget cannot hold is refused."""
    from edgespec.units import mib_text, parse_size

    counted = plan is not None and not plan.discrete  # the plan's budget is this memory
    left = max(plan.capacity - plan.used, 0) if counted else None
    if asked is None or str(asked).strip().lower() == "auto":
        import psutil

        size = min(DEFAULT_BYTES, psutil.virtual_memory().available // 4)
        return size if left is None else min(size, left)
    size = parse_size(asked, "prompt cache size") if isinstance(asked, str) else int(asked)
    if left is not None and size > left:
        raise EdgespecError(f"a prompt cache of {mib_text(size)} does not fit the memory budget: the models take "
                            f"{mib_text(plan.used)} of {mib_text(plan.capacity)}, {mib_text(left)} left (ask for "
                            "less, or 0 for none)")
    return size
