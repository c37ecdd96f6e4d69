"""Drafts published in llama.cpp's own formats, recognised from a GGUF's header before anything loads.

Users download drafts that are not small models of the target's family: EAGLE-3 heads (GGUF architecture
`eagle3`: one decoder layer reading three of the target's layers, `eagle3.target_layers`, for a target
`eagle3.target_hidden_size` wide), DFlash block drafts (`dflash`), and MTP layers inside the target's own GGUF
(`ARCH.nextn_predict_layers` > 0: Qwen3.5/3.6, GLM-4.5, DeepSeek-V3, ...). The pinned llama.cpp holds the graphs
for all three; they run only beside the target's context (an EAGLE-3 head without embeddings of its own cannot
make a context alone; docs/llama-drafts.md: how llama.cpp drives them). EAGLE-3 heads draft through
drafts/eagle3.py and DFlash blocks through drafts/dflash.py where they fit the target, MTP layers through
drafts/mtp.py (`--draft mtp`); a draft converted for another target, or beside an ONNX target, gets an error saying
what the file is and what runs instead, where llama.cpp would fail later with "could not create a context".
"""

from __future__ import annotations

import os
from pathlib import Path

from edgespec.errors import EdgespecError

MTP_DRAFT = "mtp"  # --draft mtp: the target's own MTP layers
KINDS = {"eagle3": ("an", "EAGLE-3 head"), "dflash": ("a", "DFlash block draft")}  # by GGUF architecture
RUN = ("eagle3", "dflash")  # the kinds edgespec drafts with (drafts/eagle3.py, drafts/dflash.py)
INSTEAD = ("--draft ngram (prompt lookup), a draft model of the target's vocabulary (*.gguf), or edgespec's own "
           "EAGLE head (edgespec train-heads --kind eagle)")


def gguf_meta(path: str | os.PathLike) -> dict:
    """The scalar metadata of a GGUF file (and the arrays model_info keeps), read from its header."""
    from edgespec.backends.model_info import read_gguf_header

    return read_gguf_header(Path(path))[0]


def describe(meta: dict) -> str | None:
    """What a GGUF published as a draft is, in words (None: a model like any other, architecture aside)."""
    arch = meta.get("general.architecture", "llama")
    if arch not in KINDS:
        return None
    text = f"{' '.join(KINDS[arch])} (GGUF architecture {arch}"
    width = meta.get(f"{arch}.target_hidden_size")
    layers = meta.get(f"{arch}.target_layers")
    if width:
        text += f", for a target {width} wide"
    if layers:
        text += f", reading its layers {', '.join(str(i) for i in layers)}"
    return text + ")"


def check_draft_file(path: str | os.PathLike, target: str | os.PathLike) -> None:
    """Raise a clear error where the draft GGUF at `path` is a published draft edgespec does not run, or an EAGLE-3
    head that does not fit `target` (converted for another width, or a target that is not a GGUF): what it is and
    what runs instead."""
    meta = gguf_meta(path)
    what = describe(meta)
    if what is None:
        return
    arch = meta["general.architecture"]
    fit = ""
    # an EAGLE-3 head names the target's width; a DFlash draft is as wide as its target
    wanted = meta.get(f"{arch}.target_hidden_size") or (meta.get(f"{arch}.embedding_length") if arch == "dflash"
                                                        else None)
    gguf_target = str(target).lower().endswith(".gguf")
    if wanted and gguf_target:
        target_meta = gguf_meta(target)
        width = target_meta.get(f"{target_meta.get('general.architecture', 'llama')}.embedding_length")
        if width and width != wanted:
            fit = f"; it was converted for another target (this target is {width} wide)"
    if arch in RUN and gguf_target and not fit:
        return
    if arch in RUN and not gguf_target:
        fit = f"; it runs beside a GGUF target inside llama.cpp, and {Path(target).name} is not one"
    why = "it cannot draft for this target" if arch in RUN else f"edgespec does not run {KINDS[arch][1]}s yet"
    raise EdgespecError(f"draft {Path(path).name} is {what}{fit}: {why}. Run instead: {INSTEAD}")


def mtp_layers(target: str | os.PathLike) -> tuple[str, int]:
    """The target GGUF's architecture and the MTP ("nextn") layers it carries (0: none)."""
    meta = gguf_meta(target)
    arch = meta.get("general.architecture", "llama")
    return arch, int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)


# the architectures whose MTP layers the pinned llama.cpp builds a draft graph for (LLM_GRAPH_TYPE_DECODER_MTP);
# glm4 and exaone4 carry nextn layers it keeps but does not run. qwen35 is the one tested here (random weights:
# models/random_mtp.py); the others are driven the same way by llama-server.
MTP_ARCHS = ("qwen35", "qwen35moe", "qwen3next", "glm4moe", "glm-dsa", "glm5-next", "deepseek2", "deepseek32",
             "deepseek4", "mimo2", "bailingmoe3", "cohere2moe", "hy_v3", "nemotron_h_moe", "step35")


def check_mtp(target: str | os.PathLike) -> None:
    """The error `--draft mtp` gets where the target cannot draft with MTP layers: not a GGUF, no MTP layers
    (naming its architecture), several (step35's chained heads: not driven), or an architecture whose layers
    llama.cpp keeps but does not run."""
    if not str(target).lower().endswith(".gguf"):
        raise EdgespecError(f"--draft mtp uses MTP layers inside a target's GGUF; {target} is not a GGUF file")
    arch, n = mtp_layers(target)
    name = Path(target).name
    if n == 0:
        raise EdgespecError(f"--draft mtp: the target {name} (architecture {arch}) carries no MTP layers "
                            f"({arch}.nextn_predict_layers is absent or 0); MTP layers ship inside GGUFs of models "
                            f"trained with them (Qwen3.5/3.6, GLM-4.5, DeepSeek-V3, ...). Run instead: {INSTEAD}")
    if arch not in MTP_ARCHS or n > 1:
        why = f"{n} chained MTP layers" if n > 1 else f"MTP layers llama.cpp keeps for {arch} but does not run"
        raise EdgespecError(f"--draft mtp: the target {name} (architecture {arch}) carries {why}; edgespec drives "
                            f"one MTP layer of {', '.join(MTP_ARCHS)}. Run instead: {INSTEAD}")


def llama_kind(path: str | os.PathLike) -> str | None:
    """The architecture of a draft GGUF edgespec drafts with beside the target ("eagle3": drafts/eagle3.py,
    "dflash": drafts/dflash.py), None for any other file."""
    if not (str(path).lower().endswith(".gguf") and Path(path).is_file()):
        return None
    arch = gguf_meta(path).get("general.architecture")
    return arch if arch in RUN else None


def is_eagle3(path: str | os.PathLike) -> bool:
    """Whether a draft file is an EAGLE-3 GGUF (drafts/eagle3.py drafts from it)."""
    return llama_kind(path) == "eagle3"
