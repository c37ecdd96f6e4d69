"""The Python API: load a target (and a draft) once, then generate or stream.

    import edgespec
    engine = edgespec.load()                       # default model, prompt-lookup draft
    result = engine.generate("Why is the sky blue?", max_tokens=64)
    for event in engine.stream([{"role": "user", "content": "Hi"}]):
        print(event.text, end="")

The CLI, the server and the apps are built on this; none of them decodes on its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.backends.open import open_model
from edgespec.backends.protocol import MAX_OUTPUTS, Backend
from edgespec.decode.calibrate import controller_for, measure_pass_costs
from edgespec.decode.cost import DraftController
from edgespec.decode.loop import Event, Stats, speculate
from edgespec.decode.sampling import SamplingParams
from edgespec.decode.text import render_chat
from edgespec.drafts.auto import AUTO_DRAFT
from edgespec.drafts.base import Drafter
from edgespec.drafts.spec import open_drafter
from edgespec.errors import EdgespecError
from edgespec.pair import Pair
from edgespec.run import K_MAX, LONGEST_DRAFT, MAX_TREE_WIDTH, Run, plan_for, resolve_run
from edgespec.tool_calls import MARKERS, ToolSet, chat_history

DEFAULT_DRAFT = AUTO_DRAFT
__all__ = ["DEFAULT_DRAFT", "K_MAX", "LONGEST_DRAFT", "MAX_TREE_WIDTH", "Engine", "Result", "Stream", "load",
           "open_engine", "plan_for", "prompt_tokens"]  # plan_for and the limits: run.py's, here for users


@dataclass
class Result:
    text: str  # what the model wrote
    tokens: list[int]
    stats: Stats
    content: str | None = None  # the text outside the calls (None where none is left; without tools, text)
    tool_calls: list[dict] | None = None  # with tools: the calls in OpenAI's shape (id, type, function)

    def to_dict(self) -> dict:
        calls = {} if self.tool_calls is None else {"content": self.content, "tool_calls": self.tool_calls}
        return {"text": self.text, "tokens": self.tokens, **calls, **self.stats.to_dict()}


class Stream:
    """An iterator of Events; after it is exhausted, `text`, `tokens` and `stats` are final, and with tools
    `content` and `tool_calls` (read from the text once)."""

    def __init__(self, events: Iterator[Event], stats: Stats, tools: ToolSet | None = None,
                 marker_token: int | None = None):
        self._events, self.stats, self.tools = events, stats, tools
        self._marker = marker_token  # a call opener that is a control token prints nothing: its text is given
        self.tokens: list[int] = []
        self._text: list[str] = []
        self._calls: tuple[str | None, list[dict]] | None = None

    def __iter__(self) -> Iterator[Event]:
        for event in self._events:
            if event.token is not None:
                self.tokens.append(event.token)
            if self._marker is not None and event.token == self._marker and not event.text:
                event = Event(event.token, MARKERS[self.tools.family], event.from_draft)
            self._text.append(event.text)
            yield event

    @property
    def content(self) -> str | None:
        """The text outside the calls (without tools: the text)."""
        return self._read()[0]

    @property
    def tool_calls(self) -> list[dict] | None:
        """The calls the answer made (None without tools; [] where it answered in text)."""
        return self._read()[1]

    def _read(self) -> tuple[str | None, list[dict] | None]:
        if self.tools is None:
            return self.text, None
        if self._calls is None:
            self._calls = self.tools.read(self.text)
        return self._calls

    def close(self) -> None:
        """Stop generating now (e.g. the client went away); the engine stays usable."""
        self._events.close()

    @property
    def text(self) -> str:
        return "".join(self._text)


class Engine:
    """A target model, an optional drafter, and the draft-length controller measured for them."""

    def __init__(self, target: Backend, drafter: Drafter | None, controller: DraftController | None,
                 draft_backend: Backend | None = None, plan=None, tree_width: int = 1, gate: bool = True,
                 draft_choice: dict | None = None):
        self.target, self.drafter, self.controller = target, drafter, controller
        # {"draft", "reason", "auto"}: the draft asked for, or what "auto" chose and why
        self.draft_choice = draft_choice or {"draft": drafter.name if drafter else "none", "reason": "asked for",
                                             "auto": False}
        self.tree_width = tree_width  # candidates per depth when the drafter drafts trees (1: chains)
        self.gate = gate  # a drafter that knows how sure it is ends its chains by confidence (gate.DraftGate)
        self.draft_backend = draft_backend
        self.plan = plan  # the memory plan it was loaded with (plan.planner.Plan), if any
        self._active: Stream | None = None  # one generation at a time: the models have one cache each
        self._grammar_tokenizer = None  # llguidance's view of the vocabulary, built on first use (~1 s)
        self._markers: dict[str, int | None] = {}  # tool-call family -> its opener's token

    def placement(self) -> dict:
        """Where each model runs: {"target": ..., "draft": ... or None}, each with its runtime, its device ("cpu",
        a llama.cpp GPU such as CUDA0, an onnxruntime provider) and, for llama.cpp, the layers on the GPU; a draft
        model also with how its vocabulary pairs with the target's ("vocabulary": "exact", "padded" or
        "cross-tokenizer"; for the last, "shared_tokens", and "intersection_mass": the share of the draft's
        probability on them, averaged over the proposals measured)."""
        if self.draft_backend is None:
            return {"target": self.target.placement(), "draft": None}
        model = getattr(self.drafter, "inner", self.drafter)  # behind prompt lookup (ngram+)
        pairing = model.vocabulary() if hasattr(model, "vocabulary") else {}
        return {"target": self.target.placement(), "draft": {**self.draft_backend.placement(), **pairing}}

    def prompt_tokens(self, prompt: str | Sequence[dict], *, chat: bool | None = None, tools: list[dict] | None = None,
                      tool_choice="auto", parallel_tool_calls: bool = True) -> list[int]:
        """Token ids for a prompt: a list of chat messages, or a string (chat-templated unless chat=False), with
        the tools as `stream` gives them to the model."""
        return self._prompt(prompt, chat, tools, tool_choice, parallel_tool_calls)[0]

    def _prompt(self, prompt, chat, tools, tool_choice, parallel_tool_calls) -> tuple[list[int], ToolSet | None]:
        """(the prompt's token ids, the request's tools as the generation uses them)."""
        toolset = ToolSet.of(tools, tool_choice, parallel_tool_calls, self.target.chat_template())
        if toolset is not None and isinstance(prompt, str) and chat is False:
            raise EdgespecError("tools need a chat prompt: give messages, or a string without chat=False")
        return prompt_tokens(self.target, prompt, chat=chat, tools=toolset), toolset

    def stream(self, prompt: str | Sequence[dict], *, max_tokens: int = 256, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
               stop: Sequence[str] = (), chat: bool | None = None, draft_max: int | None = None,
               json_schema: dict | str | None = None, tools: list[dict] | None = None, tool_choice="auto",
               parallel_tool_calls: bool = True) -> Stream:
        """Start generating; see `generate` for the arguments. Iterate the result for Events.

        An engine runs one generation at a time: starting a stream closes the one before it.
        """
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        if draft_max is not None and not 0 <= draft_max <= LONGEST_DRAFT:
            raise EdgespecError(f"draft max must be between 0 and {LONGEST_DRAFT}, got {draft_max}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise EdgespecError(f"seed must be a whole number from 0 up (or None), got {seed!r}")
        tokens, toolset = self._prompt(prompt, chat, tools, tool_choice, parallel_tool_calls)
        if toolset is not None and toolset.forced:
            if json_schema is not None:
                raise EdgespecError("a required tool call decodes under its function's schema: give either a "
                                    "JSON schema or a tool_choice that forces a call, not both")
            json_schema = toolset.schema()
        constraint = None
        if json_schema is not None:
            from edgespec.decode.constraint import GrammarConstraint, llg_tokenizer

            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = llg_tokenizer(self.target)
            constraint = GrammarConstraint.from_json_schema(self._grammar_tokenizer, json_schema,
                                                            self.target.vocab.n_vocab)
        stats = Stats()
        events = speculate(self.target, self.drafter, self.controller, tokens, params,
                           np.random.default_rng(seed), max_tokens=max_tokens, stop=stop,
                           draft_max=draft_max, stats=stats, constraint=constraint, tree_width=self.tree_width,
                           gate=self.gate)
        if self._active is not None:  # its rounds would interleave with ours on the same cache
            self._active.close()
        marker = self._marker_token(toolset.family) if toolset is not None and toolset.calling else None
        self._active = Stream(events, stats, toolset, marker)
        return self._active

    def _marker_token(self, family: str) -> int | None:
        """The token whose text is the family's call opener, if the vocabulary has one."""
        if family not in self._markers:
            opener = MARKERS.get(family, "").encode()
            texts = self.target.vocab.texts
            self._markers[family] = texts.index(opener) if opener and opener in texts else None
        return self._markers[family]

    def generate(self, prompt: str | Sequence[dict], **kwargs) -> Result:
        """Generate a whole answer.

        Args:
            prompt: a string, or chat messages [{"role": ..., "content": ...}].
            max_tokens: most tokens to generate. temperature/top_k/top_p/min_p: sampling
                (temperature 0 = greedy). seed: for the sampler's numpy Generator.
            stop: strings that end the answer (not included). chat: apply the model's chat
                template to a string prompt (default True). draft_max: fix the draft length
                (0 = target only) instead of letting the measured costs choose it.
            json_schema: constrain the answer to JSON valid against this schema (a dict, JSON text or a
                file path); the output is then distributed exactly as the target under that constraint.
            tools: functions the model may call, in OpenAI's shape ({"type": "function", "function": {"name",
                "description", "parameters"}}); the result's tool_calls are the calls it made.
            tool_choice: "auto" (the model chooses), "none", "required", or a function's name (or OpenAI's
                {"type": "function", "function": {"name": ...}}): a required call's arguments are decoded under
                the function's parameters schema, so they always parse and validate.
            parallel_tool_calls: allow more than one call in an answer.
        """
        stream = self.stream(prompt, **kwargs)
        for _ in stream:
            pass
        return Result(stream.text, stream.tokens, stream.stats, stream.content, stream.tool_calls)

    # What the server serves (server/app.py Served), as a Parallel offers it: an Engine is one stream of one.
    @property
    def engines(self) -> tuple[Engine]:
        """Its streams, an Engine each: itself (a Parallel has one a stream)."""
        return (self,)

    @property
    def name(self) -> str:
        """The target's name (its file's)."""
        return self.target.name

    @property
    def draft_name(self) -> str:
        """The draft model's name, else the drafter's (prompt lookup, heads), else "none"."""
        if self.draft_backend is not None:
            return self.draft_backend.name
        return self.drafter.name if self.drafter is not None else "none"

    def begin(self, stream: int) -> None:
        """Stream `stream` (0, the only one) starts a generation: there is no other to share its passes with."""

    def end(self, stream: int) -> None:
        """Stream `stream` ended its generation."""

    def cache_prompts(self, cache) -> bool:
        """Keep the states of the prompts the models read in `cache` (a backends.llama.states.PromptCache, None:
        stop), so a conversation's next turn starts from its saved state after other requests took the models'
        cache; the draft model's states too. False where the target cannot (ONNX: it reads a prompt after the
        prefix its cache holds, as without one)."""
        if self.draft_backend is not None:
            self.draft_backend.keep_states(cache)
        return self.target.keep_states(cache)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()  # an EAGLE-3 head's context reads the target's: it goes first
        for backend in (self.target, self.draft_backend):
            if backend is not None:
                backend.close()


def prompt_tokens(backend: Backend, prompt: str | Sequence[dict], *, chat: bool | None = None,
                  tools: ToolSet | None = None) -> list[int]:
    """Token ids of a prompt for a model: chat messages, or a string (chat-templated unless chat=False). tools:
    the request's tools, listed by the template (or explained in a system message), a forced call's opener
    after the prompt."""
    if isinstance(prompt, str) and chat is False:
        return backend.tokenize(prompt, special=True)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    vocab, template = backend.vocab, backend.chat_template()

    def text_of(token: int) -> str:
        return vocab.texts[token].decode("utf-8", "replace") if token >= 0 else ""  # -1: the model has none

    text = render_chat(template, chat_history(messages, template, tools), bos_token=text_of(vocab.bos_id),
                       eos_token=text_of(vocab.eos_id), tools=tools.rendered() if tools else None)
    text += tools.opener() if tools else ""
    tokens = backend.tokenize(text, special=True)
    # a template that writes the BOS itself (Llama 3, Gemma, Mistral) and a tokenizer that adds one: keep one, as
    # llama.cpp's common/chat.cpp does
    if vocab.bos_id >= 0 and tokens[:2] == [vocab.bos_id] * 2 and text.startswith(text_of(vocab.bos_id)):
        del tokens[0]
    return tokens


def load(target: str | os.PathLike | Pair | Run | None = None, draft: str | os.PathLike | None = DEFAULT_DRAFT, *,
         n_ctx: int | None = None, threads: int | None = None, k_max: int = K_MAX, provider: str | None = None,
         device: str | None = None, budget: str | int | None = None, kv_type: str | None = None,
         profiles: str | os.PathLike | None = None, hidden: bool = False, tree_width: int = 1,
         gate: bool = True, spin: bool | str | None = None, gpu_layers: int | str | None = None) -> Engine:
    """Load a target and a draft and measure what drafting costs on this device.

    Args:
        target: a GGUF file, an ONNX export folder, or a GGUF on the Hugging Face hub by name,
            org/repo[:QUANT][@REVISION] (models/hub.py); None for the default model (SmolLM2-135M-Instruct); or
            a Pair (pair.resolve_pair) of a target and a draft resolved already, `draft` then unread; or a Run
            (run.resolve_run) of one stream, every other argument then unread.
        draft: "auto" (the default: prompt lookup, with the shipped EAGLE head behind it on an ONNX export of the
            default model, where bench measured that faster; for a target by hub name, a smaller model with its
            vocabulary found in the hub cache or the catalogue, choose_draft), "ngram" (prompt lookup), "none", a
            model (GGUF file, ONNX export folder or hub name; the two may be of different formats) with the
            target's vocabulary, that vocabulary padded, or another tokenizer (drafts/spec.model_drafter), or
            heads trained for this target (*.medusa.npz or *.eagle.npz from edgespec train-heads); "eagle": the
            EAGLE head that ships for the default model; "ngram+" before a model or heads: prompt lookup where
            the text repeats itself, that draft elsewhere.
        n_ctx: context length in tokens (default 2048; with a plan, the most up to 2048 that fits).
        threads: CPU threads (default: the cores it may run on, at most 8). k_max: the longest draft the controller
            may choose.
        provider: for ONNX models, cpu|cuda|tensorrt|coreml|auto (default cpu; auto with a device profile).
        device, budget: plan memory for a device profile ("auto" = this machine, "orin-nano-8gb", ...) and/or a
            budget ("6GiB"), and load with the plan's settings; a pair that cannot fit is refused before any
            weights load. profiles: a TOML file of extra device profiles.
        gpu_layers: llama.cpp layers on the GPU, target and draft alike. None (default): where this llama.cpp
            build has a GPU (CUDA, Metal, Vulkan, ...), what fits there, as the plan for this machine
            (device "auto") places it; ONNX models on onnxruntime's best provider (provider "auto"). "all" or a
            number: that many; 0: the CPU only, ONNX models on onnxruntime's CPU provider.
        kv_type: llama.cpp KV cache type, f16|q8_0|q4_0 (default f16; with a plan, what fits).
        hidden: the target also returns its hidden states (on by itself for a heads draft).
        tree_width: heads and draft models draft trees with up to this many candidates per position, in the
            shape the controller plans from the pass costs (decode/shape.py), verified in one pass (GGUF targets);
            1 drafts chains.
        gate: draft models and heads end each chain where one more token would not pay, judged from their
            confidence in it (decode/gate.DraftGate); False drafts the controller's k every round.
        spin: how an ONNX target's onnxruntime threads spin between ops (backends/onnx/folder.open_session):
            True, also between runs; "runs", within each run only; False, never. None (default): True where
            nothing runs beside the target (no draft, or prompt lookup), "runs" beside a draft model or heads,
            whose threads need the cores between the target's runs.
    """
    return open_engine(resolve_run(target, draft, n_ctx=n_ctx, threads=threads, k_max=k_max, provider=provider,
                                   device=device, budget=budget, kv_type=kv_type, profiles=profiles, hidden=hidden,
                                   tree_width=tree_width, gate=gate, spin=spin, gpu_layers=gpu_layers))


def open_engine(run: Run) -> Engine:
    """Open a Run of one stream (run.resolve_run): its target, its drafter, their pass costs timed here and the
    controller built from them."""
    draft = run.pair.draft
    target_backend = open_model(run.pair.target, n_ctx=run.n_ctx, threads=run.threads, provider=run.provider,
                                hidden=run.hidden, spin=run.spin, load_mtp=draft.inner.kind == "mtp",
                                sequences=MAX_OUTPUTS if run.tree_width > 1 else None,  # a branch a sequence
                                **run.target_settings.as_kwargs())
    try:
        drafter, draft_backend, draft_cost = open_drafter(draft, target_backend, window=run.draft_window,
                                                          threads=run.threads, provider=run.provider,
                                                          **run.draft_settings.as_kwargs())
        if run.tree_width > 1 and not drafter.trees:
            if draft_backend is not None:
                draft_backend.close()
            raise EdgespecError(f"{draft}: a draft model with another vocabulary than the target's drafts chains "
                                "(its tokens are the target's only once retokenized): a tree width of 1")
    except BaseException:
        target_backend.close()
        raise
    k_max = min(run.k_max, LONGEST_DRAFT // run.tree_width)  # a round's tree fits one pass
    pass_costs = measure_pass_costs(target_backend, k_max * run.tree_width + 1) if drafter is not None else {}
    controller = controller_for(target_backend, drafter, draft_backend, pass_costs, draft_cost, k_max)
    return Engine(target_backend, drafter, controller, draft_backend, run.plan, tree_width=run.tree_width,
                  gate=run.gate, draft_choice=dict(run.pair.choice))
