"""Every common chat family: its real chat template renders as transformers renders it, its end-of-turn token
ends generation, and its special tokens tokenize as single ids (docs/chat-templates.md).

The templates are the models' own (tests/data/chat_templates, SOURCES.md there). Vocabularies are small stand-ins:
the family's special tokens at their places around a byte-level alphabet, with the tokenizer_config.json,
config.json and generation_config.json facts that decide BOS, EOS and end of generation. The GGUF llama.cpp's
converter would write from the same folder is the reference for those facts.
"""

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from jinja2 import TemplateError

from edgespec.decode.text import render_chat
from edgespec.errors import EdgespecError

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
# template file -> (bos_token, eos_token) as the model's tokenizer_config.json names them
FAMILIES = {
    "llama-3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "phi-3.5": ("<s>", "<|endoftext|>"),
    "phi-4": ("<|endoftext|>", "<|im_end|>"),
    "gemma-2": ("<bos>", "<eos>"),
    "gemma-3": ("<bos>", "<eos>"),
    "mistral-nemo": ("<s>", "</s>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
}
REFUSES_SYSTEM = {"gemma-2"}  # raise_exception('System role not supported')
ALTERNATES = {"gemma-2", "gemma-3", "mistral-nemo"}  # refuse two user turns in a row

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
USER = {"role": "user", "content": "  What is 2 + 2?\n"}  # the whitespace shows which templates trim
ANSWER = {"role": "assistant", "content": "4, written «four» <b>&</b>."}
AGAIN = {"role": "user", "content": "And 3 + 3? Ünïcödé 😀"}
CONVERSATIONS = {
    "user": [USER],
    "system+user": [SYSTEM, USER],
    "multi-turn": [USER, ANSWER, AGAIN],
    "system+multi-turn": [SYSTEM, USER, ANSWER, AGAIN],
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, e.g. <Zürich> & \"Genève\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
TOOL_FAMILIES = ["llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "mistral-nemo"]  # templates that list tools


def template(family: str) -> str:
    return (TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8")


def special_tokens(family: str) -> dict:
    bos, eos = FAMILIES[family]
    return {"bos_token": bos or "", "eos_token": eos}


def reference(family: str, messages: list[dict], **kwargs) -> str:
    """transformers' text: what apply_chat_template renders (its render_jinja_template). Skips without it."""
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = chat_template_utils.render_jinja_template(
        [messages], chat_template=template(family), **special_tokens(family), **kwargs)
    return rendered[0]


# --- rendering: the same text as transformers ---


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_renders_as_transformers(family, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    kwargs = {"add_generation_prompt": add_generation_prompt}
    if family in REFUSES_SYSTEM and messages[0]["role"] == "system":
        with pytest.raises(TemplateError) as theirs:
            reference(family, messages, **kwargs)
        with pytest.raises(EdgespecError, match="refused") as ours:
            render_chat(template(family), messages, **special_tokens(family), **kwargs)
        assert str(theirs.value) in str(ours.value)
        return
    assert render_chat(template(family), messages, **special_tokens(family), **kwargs) == reference(
        family, messages, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_generation_prompt_opens_the_assistants_turn(family):
    messages = CONVERSATIONS["multi-turn"]
    prompt = render_chat(template(family), messages, **special_tokens(family))
    assert prompt == reference(family, messages, add_generation_prompt=True)
    closed = render_chat(template(family), messages, **special_tokens(family), add_generation_prompt=False)
    opening = {"llama-3.1": "<|start_header_id|>assistant<|end_header_id|>\n\n",
               "llama-3.2": "<|start_header_id|>assistant<|end_header_id|>\n\n",
               "qwen2.5": "<|im_start|>assistant\n", "qwen3": "<|im_start|>assistant\n",
               "smollm2": "<|im_start|>assistant\n", "phi-3.5": "<|assistant|>\n",
               "gemma-2": "<start_of_turn>model\n", "gemma-3": "<start_of_turn>model\n"}
    if family in opening:
        assert prompt.endswith(opening[family]) and not closed.endswith(opening[family])
    else:  # phi-4 opens the answer after every user turn; Mistral's [/INST] ends the question either way
        assert prompt.endswith("<|im_start|>assistant<|im_sep|>" if family == "phi-4" else "[/INST]")


@pytest.mark.parametrize("family", sorted(ALTERNATES))
def test_templates_that_want_alternating_turns_refuse_as_transformers_does(family):
    messages = [USER, AGAIN]
    with pytest.raises(TemplateError) as theirs:
        reference(family, messages, add_generation_prompt=True)
    with pytest.raises(EdgespecError, match="refused") as ours:
        render_chat(template(family), messages, **special_tokens(family))
    assert "alternate" in str(theirs.value) and str(theirs.value) in str(ours.value)


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_tools_render_as_transformers_renders_them(family):
    # transformers' tojson keeps key order and writes <, >, & and non-ASCII as they are; jinja2's own does not
    messages = [SYSTEM, {"role": "user", "content": "Weather in Zürich?"}]
    ours = render_chat(template(family), messages, **special_tokens(family), tools=TOOLS)
    assert ours == reference(family, messages, add_generation_prompt=True, tools=TOOLS)
    assert "<Zürich> &" in ours


def test_template_variables_pass_through():
    messages = [USER]
    no_thinking = render_chat(template("qwen3"), messages, **special_tokens("qwen3"), enable_thinking=False)
    assert no_thinking == reference("qwen3", messages, add_generation_prompt=True, enable_thinking=False)
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    dated = render_chat(template("llama-3.1"), messages, **special_tokens("llama-3.1"), date_string="1 Jan 2025")
    assert dated == reference("llama-3.1", messages, add_generation_prompt=True, date_string="1 Jan 2025")
    assert "Today Date: 1 Jan 2025\n" in dated


def test_llama_3_2_dates_its_prompt_today():
    # its template calls strftime_now where defined, and falls back to 26 Jul 2024 where not
    text = render_chat(template("llama-3.2"), [USER], **special_tokens("llama-3.2"))
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n" in text


# --- vocabularies: end of generation and special tokens ---


@dataclass(frozen=True)
class Tokens:
    """A family's special tokens and the files that say which ends what; texts stand for ids."""

    template: str  # the chat template whose prompt is tokenized
    front: tuple[str, ...]  # special tokens at ids 0, 1, ... (SentencePiece and Tekken vocabularies)
    back: tuple[str, ...]  # special tokens after the ordinary vocabulary (byte-level BPE ones)
    config_eos: tuple[str, ...]  # config.json's eos_token_id (a list where the model has one)
    generation_eos: tuple[str, ...]  # generation_config.json's
    end_of_generation: frozenset[str]  # what llama.cpp stops on
    plain: tuple[str, ...] = ()  # added tokens not marked special (they print)


LLAMA_3 = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
           "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")
QWEN = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
        "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
        "<|image_pad|>", "<|video_pad|>")
QWEN_PLAIN = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>")
QWEN_EOG = frozenset({"<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"})
GEMMA = ("<pad>", "<eos>", "<bos>", "<unk>")
VOCABS = {
    "llama-3": Tokens("llama-3.1", (), LLAMA_3, ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
                      ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
                      frozenset({"<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"})),
    "qwen2.5": Tokens("qwen2.5", (), QWEN, ("<|im_end|>",), ("<|im_end|>", "<|endoftext|>"), QWEN_EOG, QWEN_PLAIN),
    "qwen3": Tokens("qwen3", (), QWEN, ("<|im_end|>",), ("<|im_end|>", "<|endoftext|>"), QWEN_EOG,
                    QWEN_PLAIN + ("<tool_response>", "</tool_response>", "<think>", "</think>")),
    # Phi-3.5's generation_config.json also lists <|assistant|>: its GGUF does not stop there, so neither do we
    "phi-3.5": Tokens("phi-3.5", ("<unk>", "<s>", "</s>"),
                      ("<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
                       "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>",
                       "<|user|>"),
                      ("<|endoftext|>",), ("<|end|>", "<|assistant|>", "<|endoftext|>"),
                      frozenset({"</s>", "<|endoftext|>", "<|end|>"})),
    "phi-4": Tokens("phi-4", (), ("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                                  "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endofprompt|>", "<|dummy_85|>"),
                    ("<|im_end|>",), ("<|im_end|>",), frozenset({"<|endoftext|>", "<|im_end|>"})),
    "gemma-2": Tokens("gemma-2", GEMMA + ("<start_of_turn>", "<end_of_turn>"), (), ("<eos>", "<end_of_turn>"),
                      ("<eos>", "<end_of_turn>"), frozenset({"<eos>", "<end_of_turn>"})),
    "gemma-3": Tokens("gemma-3", GEMMA + ("<start_of_turn>", "<end_of_turn>"), ("<start_of_image>",),
                      ("<eos>", "<end_of_turn>"), ("<eos>", "<end_of_turn>"), frozenset({"<eos>", "<end_of_turn>"})),
    "mistral-nemo": Tokens("mistral-nemo", ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
                                            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]",
                                            "<pad>", "[PREFIX]", "[MIDDLE]", "[SUFFIX]"),
                           (), ("</s>",), ("</s>",), frozenset({"</s>"})),
    "smollm2": Tokens("smollm2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                                  "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
                                  "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
                                  "<jupyter_output>", "<jupyter_script>", "<empty_output>"),
                      (), ("<|im_end|>",), ("<|im_end|>",), frozenset({"<|endoftext|>", "<|im_end|>", "<reponame>"})),
}


def export_folder(folder: Path, spec: Tokens, bos: str | None, eos: str) -> tuple[Path, list[str]]:
    """An export folder's tokenizer files for a stand-in vocabulary; the token texts by id."""
    import json

    tokenizers = pytest.importorskip("tokenizers")
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    texts = [*spec.front, *alphabet, "qz", *spec.back, *spec.plain]
    ids = {text: i for i, text in enumerate(texts)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=ids, merges=[("q", "z")]))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    tokenizer.add_special_tokens([*spec.front, *spec.back])
    tokenizer.add_tokens([tokenizers.AddedToken(text, special=False, normalized=False) for text in spec.plain])
    tokenizer.save(str(folder / "tokenizer.json"))

    def id_list(names):
        return [ids[n] for n in names] if len(names) > 1 else ids[names[0]]

    files = {"tokenizer_config.json": {"bos_token": bos, "eos_token": eos, "chat_template": template(spec.template)},
             "config.json": {"bos_token_id": ids.get(bos or "<|endoftext|>"), "eos_token_id": id_list(spec.config_eos),
                             "vocab_size": len(texts)},
             "generation_config.json": {"eos_token_id": id_list(spec.generation_eos)}}
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content), encoding="utf-8")
    return folder, texts


def gguf_of(folder: Path, texts: list[str], added: dict[int, bool], path: Path) -> Path:
    """The vocabulary-only GGUF llama.cpp's converter writes for the folder: token types as its get_vocab_base
    sets them (special or special-looking added tokens CONTROL, other added ones USER_DEFINED), BOS and EOS by
    gguf-py's SpecialVocab."""
    gguf = pytest.importorskip("gguf")
    from edgespec.backends.onnx.vocab import looks_special

    types = [gguf.TokenType.CONTROL if i in added and (added[i] or looks_special(text))
             else gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL
             for i, text in enumerate(texts)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(8)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(["q z"])
    gguf.SpecialVocab(folder, load_merges=False, n_vocab=len(texts)).add_to_gguf(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(params=VOCABS)
def family_vocab(request, tmp_path):
    """(family, export folder, the tokenizers Tokenizer and Vocab edgespec reads from it)."""
    from edgespec.backends.onnx.folder import read_json
    from edgespec.backends.onnx.vocab import read_vocab

    spec = VOCABS[request.param]
    folder, texts = export_folder(tmp_path, spec, *FAMILIES[spec.template])
    tokenizer, vocab = read_vocab(folder, read_json(folder / "config.json"), len(texts))
    return request.param, folder, tokenizer, vocab


def test_the_end_of_turn_token_ends_generation(family_vocab):
    family, _, _, vocab = family_vocab
    eog = {vocab.texts[i].decode() for i in vocab.eog_ids}
    assert eog == VOCABS[family].end_of_generation
    assert vocab.texts[vocab.eos_id].decode() == FAMILIES[VOCABS[family].template][1]


def test_special_tokens_of_a_rendered_prompt_are_single_ids(family_vocab):
    family, _, tokenizer, vocab = family_vocab
    spec = VOCABS[family]
    messages = CONVERSATIONS["multi-turn" if spec.template in REFUSES_SYSTEM else "system+multi-turn"]
    prompt = render_chat(template(spec.template), messages, **special_tokens(spec.template))
    tokenizer.encode_special_tokens = False  # as OnnxBackend.tokenize(special=True) parses them
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    assert b"".join(vocab.pieces[i] if vocab.pieces[i] else vocab.texts[i] for i in ids) == prompt.encode()
    for text in (*spec.front, *spec.back, *spec.plain):
        assert ids.count(vocab.texts.index(text.encode())) == prompt.count(text), text
    assert any(vocab.texts[i].decode() in spec.end_of_generation for i in ids)  # the answer's turn ends with one


def llama_cpp_reads(folder: Path, tokenizer, vocab):
    """llama.cpp's tokenizer (vocab_only) on the GGUF its converter writes for the folder."""
    pytest.importorskip("llama_cpp")
    from edgespec.backends.llama.model import LlamaTokenizer

    added = {i: token.special for i, token in tokenizer.get_added_tokens_decoder().items()}
    return LlamaTokenizer(gguf_of(folder, [t.decode() for t in vocab.texts], added, folder / "vocab.gguf"))


def test_the_vocab_equals_the_gguf_llama_cpp_reads_from_the_same_files(family_vocab):
    family, folder, tokenizer, vocab = family_vocab
    gguf = llama_cpp_reads(folder, tokenizer, vocab)
    try:
        assert gguf.vocab.eog_ids == vocab.eog_ids
        assert gguf.vocab == vocab
        spec = VOCABS[family]
        prompt = render_chat(template(spec.template), CONVERSATIONS["multi-turn"], **special_tokens(spec.template))
        tokenizer.encode_special_tokens = False
        assert gguf.tokenize(prompt, special=True) == tokenizer.encode(prompt, add_special_tokens=False).ids
    finally:
        gguf.close()


@pytest.mark.parametrize("front, eos, end_of_generation", [
    (("<unk>", "<s>", "</s>", "<|tool_response>", "<turn|>"), "<turn|>", {"<|tool_response>", "<turn|>"}),  # gemma4
    (("<unk>", "</s>", "<|plamo:eos|>"), "<|plamo:eos|>", {"<|plamo:eos|>"}),  # plamo: </s> is text there
    (("<|end|>", "<|calls|>", "<|flush|>", "<|endoftext|>"), "<|endoftext|>",
     {"<|calls|>", "<|flush|>", "<|endoftext|>"}),  # solar-open: <|end|> ends a message, not the answer
    (("<|end|>", "<|return|>", "<|call|>"), "<|return|>", {"<|return|>", "<|call|>"}),  # gpt-oss
    (("<unk>", "<s>", "</s>", "[PAD]"), "<s>", {"<s>", "</s>", "[PAD]"}),  # [PAD]: Kimi-K2's fill-in-the-middle pad
])
def test_llama_cpps_exceptions_to_its_text_rule(tmp_path, front, eos, end_of_generation):
    from edgespec.backends.onnx.folder import read_json
    from edgespec.backends.onnx.vocab import read_vocab

    spec = Tokens("smollm2", front, (), (eos,), (eos,), frozenset(end_of_generation))
    folder, texts = export_folder(tmp_path, spec, None, eos)
    tokenizer, vocab = read_vocab(folder, read_json(folder / "config.json"), len(texts))
    assert {vocab.texts[i].decode() for i in vocab.eog_ids} == end_of_generation
    gguf = llama_cpp_reads(folder, tokenizer, vocab)
    try:
        assert gguf.vocab.eog_ids == vocab.eog_ids
    finally:
        gguf.close()


class BosAddingTokenizer:
    """A model whose tokenizer adds a BOS and parses its text as one id, as a Llama 3 GGUF's does: characters are
    ids from 2 up, the BOS text 0, the EOS text 1."""

    def __init__(self, family: str):
        from edgespec.backends.protocol import Vocab

        tokens = special_tokens(family)
        self.bos, self.eos, self._template = tokens["bos_token"], tokens["eos_token"], template(family)
        texts = (self.bos.encode(), self.eos.encode())
        self.vocab = Vocab(texts=texts, pieces=(b"", b""), bos_id=0, eos_id=1, eog_ids=frozenset([1]))

    def chat_template(self):
        return self._template

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        ids = [0] if special else []
        while text:
            if special and text.startswith(self.bos):
                ids.append(0)
                text = text[len(self.bos):]
            else:
                ids.append(2 + ord(text[0]))
                text = text[1:]
        return ids


@pytest.mark.parametrize("family", ["llama-3.1", "gemma-2"])
def test_a_template_that_writes_the_bos_and_a_tokenizer_that_adds_one_make_one(family):
    from edgespec.api import prompt_tokens

    model = BosAddingTokenizer(family)
    assert render_chat(template(family), [{"role": "user", "content": "hi"}],
                       **special_tokens(family)).startswith(model.bos)
    tokens = prompt_tokens(model, "hi")
    assert tokens[0] == 0 and tokens[1] != 0
    assert prompt_tokens(model, "hi", chat=False) == [0, 2 + ord("h"), 2 + ord("i")]
