"""An ONNX export's vocabulary in llama.cpp's conventions (token texts, printed pieces, BOS/EOS as its converter
picks them, end-of-generation ids by its text rule), so an ONNX export and a GGUF of the same model have equal
Vocabs and can form a mixed target/draft pair. Read with the `tokenizers` library.
"""

from __future__ import annotations

from pathlib import Path

from edgespec.backends.onnx.folder import MODEL_FILE, read_json, require
from edgespec.backends.protocol import Vocab
from edgespec.errors import EdgespecError

# llama.cpp decides end of generation by token text (ggml-org/llama.cpp#9606). check_compatible requires equal
# eog_ids, so an ONNX export must apply the same rule as a GGUF of the same model. The lists follow
# src/llama-vocab.cpp (llama_vocab::impl::load, "maintain a list of tokens that cause end-of-generation") of the
# llama.cpp that llama-cpp-python 0.3.36 builds, the one the GGUF backend runs.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~[")
# fill-in-the-middle pad / repo / file-separator tokens end generation too: llama.cpp takes the first it meets
# of each kind (hash order); we take the lowest id. SmolLM2's <reponame> (id 4) is one of these.
FIM_EOG_TEXTS = (("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
                 ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
                 ("<|file_sep|>",))


def read_vocab(folder: Path, config: dict, n_vocab: int):
    """(the tokenizers Tokenizer, the Vocab) of an export folder, in llama.cpp's conventions."""
    tokenizers = require("tokenizers")
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise EdgespecError(f"{folder} has no tokenizer.json: export the model with: edgespec export --to onnx")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for files it cannot parse
        raise EdgespecError(f"{path} is not a tokenizer the tokenizers library can read: {e}") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > n_vocab:
        raise EdgespecError(f"{path} has {size} tokens but {folder / MODEL_FILE} scores only {n_vocab}")
    # ids the embedding has but the tokenizer lacks are named as llama.cpp's converter names them
    texts = [tokenizer.id_to_token(i) or f"[PAD{i}]" for i in range(n_vocab)]
    added = tokenizer.get_added_tokens_decoder()  # id -> AddedToken
    byte_level = tokenizer.decoder is not None and b"ByteLevel" in tokenizer.decoder.__getstate__()  # its JSON
    # control tokens print nothing, nor do rows the tokenizer does not name (llama.cpp's converter marks them unused)
    pieces = [b"" if i >= size or i in added and (added[i].special or looks_special(text))
              else text.encode("utf-8") if i in added
              else piece(text, byte_level) for i, text in enumerate(texts)]
    ids = tokenizer.get_vocab(with_added_tokens=True)  # text -> id
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    generation = read_json(folder / "generation_config.json")
    eos_id = special_id("eos", tokenizer_config, config, generation, ids)
    # only the one EOS id, as a GGUF holds: generation_config.json's other eos ids are not llama.cpp's (Phi-3.5
    # lists <|assistant|>, which its GGUF does not stop on); the end-of-turn ids of the families it lists for
    # (Llama 3, Qwen, Gemma) end generation by their text anyway
    vocab = Vocab(texts=tuple(t.encode("utf-8") for t in texts), pieces=tuple(pieces),
                  bos_id=special_id("bos", tokenizer_config, config, generation, ids), eos_id=eos_id,
                  eog_ids=eog_ids(ids, {eos_id} if eos_id >= 0 else set()))
    return tokenizer, vocab


def special_id(kind: str, tokenizer_config: dict, config: dict, generation: dict, ids: dict[str, int]) -> int:
    """The bos or eos id as llama.cpp's converter picks it: tokenizer_config.json's token text, else config.json's
    id, else generation_config.json's (the first of a list); -1, llama.cpp's 'no token', when none says."""
    entry = tokenizer_config.get(f"{kind}_token")
    text = entry.get("content") if isinstance(entry, dict) else entry
    if isinstance(text, str) and text in ids:
        return ids[text]
    for source in (config, generation):
        value = source.get(f"{kind}_token_id")
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int):
            return value
    return -1


def eog_ids(ids: dict[str, int], eos_ids: set[int]) -> frozenset[int]:
    """End-of-generation ids: the EOS ids and the tokens llama.cpp's text rule marks (see EOG_TEXTS), less the
    two it takes back after adding the EOS."""
    found = {ids[text] for text in EOG_TEXTS if text in ids} | eos_ids
    for kind in FIM_EOG_TEXTS:
        candidates = [ids[text] for text in kind if text in ids]
        if candidates:
            found.add(min(candidates))

    def ends(*texts: str) -> bool:
        return any(ids.get(text, -1) in found for text in texts)

    if ends("<|end|>") and ends("<|call|>", "<|calls|>") and ends("<|return|>", "<|flush|>"):
        found.discard(ids["<|end|>"])  # gpt-oss, solar-open: <|end|> ends a message, not the answer
    if ends("</s>") and ends("<|tool_response>", "<|plamo:eos|>"):
        found.discard(ids["</s>"])  # gemma4, plamo: </s> is a normal token there
    return frozenset(found)


def looks_special(text: str) -> bool:
    """Whether llama.cpp's converter makes an added token that is not marked special a control token anyway
    (ModelBase.does_token_look_special, convert_hf_to_gguf): a GGUF then prints it as nothing. Qwen's <|fim_pad|>."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>")) or (text.startswith("<unused") and text.endswith(">")))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table inverted: the printable character byte-level BPE uses -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}  # these bytes stand for themselves
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + n): b for n, b in enumerate(others)})  # the rest map to U+0100, U+0101, ...
    return table


BYTE_DECODER = _byte_decoder()


def piece(text: str, byte_level: bool) -> bytes:
    """The bytes a vocabulary token prints: byte-level BPE maps each character back to its byte; SentencePiece
    vocabularies write a space as U+2581 and raw bytes as <0xNN>."""
    if byte_level:
        return b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode("utf-8") for c in text)
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        return bytes([int(text[3:5], 16)])
    return text.replace("\u2581", " ").encode("utf-8")
