"""Hugging Face checkpoints through transformers and torch (the only module importing them).

Used as the source side of parity checks and to read facts about a checkpoint before converting it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError


def read_config(folder: Path) -> dict:
    """config.json of a checkpoint folder, or a clear error."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise EdgespecError(f"{folder} is not a Hugging Face checkpoint folder (no config.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EdgespecError(f"{path} is not valid JSON: {e}") from None


def _torch():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise EdgespecError("exporting needs the export extra: pip install 'edgespec[export]'") from e
    return torch, transformers


def load_tokenizer(folder: str | Path):
    """The (fast) tokenizer saved in a folder, as transformers loads it."""
    _, transformers = _torch()
    return transformers.AutoTokenizer.from_pretrained(Path(folder))


class HFModel:
    """A causal LM checkpoint on the CPU in float32, as a parity LogitsModel.

    Its answers (logits, greedy continuations) are kept for the last checkpoint asked, keyed by its files' sizes and
    times: exports of one checkpoint in one process (a pair's target and draft, each quantization) check parity
    against the same source, which transformers then loads and runs once."""

    _answers: dict = {}  # question -> answer, for the checkpoint _answered_key names
    _answered_key: tuple | None = None

    def __init__(self, folder: str | Path):
        torch, transformers = _torch()
        self.folder = Path(folder)
        self._torch, self._transformers = torch, transformers
        self.tokenizer = load_tokenizer(self.folder)
        self._model = None
        self._key = (str(self.folder.resolve()), tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                                           for f in self.folder.iterdir() if f.is_file())))

    @property
    def model(self):
        if self._model is None:
            self._model = self._transformers.AutoModelForCausalLM.from_pretrained(self.folder,
                                                                                  dtype=self._torch.float32)
            self._model.eval()
        return self._model

    def _kept(self, question: tuple, answer):
        """The answer to question for this checkpoint, computed by answer() the first time."""
        if HFModel._answered_key != self._key:
            HFModel._answers, HFModel._answered_key = {}, self._key
        if question not in HFModel._answers:
            HFModel._answers[question] = answer()
        return HFModel._answers[question]

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def logits(self, ids: list[int]) -> np.ndarray:  # [T, V]
        return self._kept(("logits", tuple(ids)), lambda: self._logits(ids)).copy()

    def _logits(self, ids: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            out = self.model(self._torch.tensor([ids]))
        return out.logits[0].float().numpy()

    def greedy(self, ids: list[int], n: int) -> list[int]:
        return list(self._kept(("greedy", tuple(ids), n), lambda: self._greedy(ids, n)))

    def _greedy(self, ids: list[int], n: int) -> list[int]:
        with self._torch.no_grad():
            out = self.model.generate(self._torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                      attention_mask=self._torch.ones(1, len(ids), dtype=self._torch.long))
        tokens = out[0, len(ids):].tolist()
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for i, t in enumerate(tokens):  # the runtime does not emit the end token; neither do we here
            if t in eos:
                return tokens[:i]
        return tokens
