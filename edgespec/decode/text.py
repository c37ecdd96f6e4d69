"""Token bytes to printable text, and chat messages to a prompt.

`TextStream` turns token pieces into text that is safe to print as it comes: a UTF-8 character split
across tokens waits for its last byte, and text that may be the start of a stop string waits until
it is known not to be one. `render_chat` renders a model's Jinja chat template to the text Hugging Face
transformers renders for it (docs/chat-templates.md).
"""

from __future__ import annotations

import codecs
import functools
import json
from collections.abc import Sequence
from datetime import datetime

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


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, tools: list[dict] | None = None,
                documents: list[dict] | None = None, **template_kwargs) -> str:
    """Apply a Jinja chat template (as stored in GGUF metadata or tokenizer_config.json) to chat messages.

    The text is the one Hugging Face transformers renders (its apply_chat_template, the reference for every chat
    template: docs/chat-templates.md). add_generation_prompt ends the text where the assistant's answer begins;
    tools and documents are passed as transformers passes them (None when not given); template_kwargs are the
    variables some templates read, e.g. enable_thinking=False (Qwen 3) or date_string="26 Jul 2024" (Llama 3.x).
    """
    if not template:
        raise EdgespecError("this model has no chat template in its metadata: use --raw and write the prompt yourself")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise EdgespecError(f"a chat message needs 'role' and 'content', got {m!r}")
    from jinja2 import TemplateError

    try:
        return _compile(template).render(messages=messages, tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                                         eos_token=eos_token, **template_kwargs)
    except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as e:
        # TemplateError covers syntax, undefined names and the sandbox; the others are template code meeting
        # messages of a shape it does not expect (content None, a list where it adds strings)
        raise EdgespecError(f"the model's chat template failed: {e}") from e


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    """The template in an environment like transformers' (chat_template_utils._compile_jinja_template): a sandbox
    with loop controls ({% break %}), its tojson, raise_exception and strftime_now, and {% generation %} blocks."""
    import jinja2.ext
    from jinja2 import TemplateError, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %} marks the assistant's text for training masks; rendering a
        prompt keeps the body as it is. A call block, as transformers' AssistantTracker, so that a {% set %}
        inside stays inside."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise EdgespecError(f"the chat template refused the messages: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own tojson sorts keys and escapes <, >, & and ' for HTML: templates expect neither
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise EdgespecError(f"the model's chat template failed: {e}") from e
