"""Token bytes to printable text, and chat messages to a prompt.

`TextStream` turns token pieces into text that is safe to print as it comes: a UTF-8 character split
across tokens waits for its last byte, and text that may be the start of a stop string waits until
it is known not to be one.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from edgespec.errors import EdgespecError


class TextStream:
    """Feed token pieces (bytes); get the text that can be shown now."""

    def __init__(self, stop: Sequence[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = [s for s in stop if s]
        self._held = ""  # decoded text not yet released: it may begin a stop string
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        return self._release(self._held + self._decoder.decode(piece))

    def flush(self) -> str:
        """Everything still held, at the end of generation (a dangling partial character prints as U+FFFD)."""
        if self.stopped:
            return ""
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return text

    def _release(self, text: str) -> str:
        if self.stopped:
            return ""
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[:min(hits)]
        hold = max((_overlap(text, s) for s in self._stop), default=0)
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "", eos_token: str = "") -> str:
    """Apply a Jinja chat template (as stored in GGUF metadata) with a generation prompt."""
    if not template:
        raise EdgespecError("this model has no chat template in its metadata: use --raw and write the prompt yourself")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise EdgespecError(f"a chat message needs 'role' and 'content', got {m!r}")
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise EdgespecError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
    except TemplateError as e:
        raise EdgespecError(f"the model's chat template failed: {e}") from e
