"""Export models from Hugging Face checkpoints (or GGUF files) to GGUF and ONNX, quantized."""

from __future__ import annotations

from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models.source import Source, resolve

FORMATS = ("gguf", "onnx")
DEFAULT_QUANTS = {"gguf": ("f16", "q4_k_m"), "onnx": ("fp32", "int8")}  # (target, draft)


def export_source(source: Source, to: str, quant: str, out: str | Path, *, progress: bool = True,
                  parity: bool = True) -> dict:
    """Export a resolved source; returns the summary (format, quant, path, weight_bytes, parity ...)."""
    if to == "gguf":
        from edgespec.export.gguf import export_gguf

        return export_gguf(source, Path(out), quant, progress=progress, check_parity=parity)
    if to == "onnx":
        if source.kind != "hf":
            raise EdgespecError("ONNX export starts from a Hugging Face checkpoint (a folder or hub id), not a GGUF")
        from edgespec.export.files import count_params
        from edgespec.export.onnx import export_onnx

        summary = export_onnx(source.path, Path(out), quant, progress=progress, parity=parity)
        return {**summary, "source": source.ref, "n_params": count_params(source)}
    raise EdgespecError(f"unknown export format '{to}': choose one of {', '.join(FORMATS)}")


def export(src: str, to: str, quant: str, out: str | Path, *, revision: str | None = None,
           progress: bool = True, parity: bool = True) -> dict:
    """Resolve `src` (folder, hub id or GGUF) and export it; see export_source."""
    return export_source(resolve(src, revision=revision, progress=progress), to, quant, out,
                         progress=progress, parity=parity)


def export_pair(target: str, draft: str, to: str, out_dir: str | Path, *, target_quant: str | None = None,
                draft_quant: str | None = None, revision: str | None = None, progress: bool = True,
                parity: bool = True) -> dict:
    """Export both models of a pair into out_dir after checking their vocabularies; write pair.json."""
    from edgespec.export.pair import check_pair, write_manifest

    if to not in FORMATS:
        raise EdgespecError(f"unknown export format '{to}': choose one of {', '.join(FORMATS)}")
    target_quant = target_quant or DEFAULT_QUANTS[to][0]
    draft_quant = draft_quant or DEFAULT_QUANTS[to][1]
    target_src = resolve(target, revision=revision, progress=progress)
    draft_src = resolve(draft, revision=revision, progress=progress)
    tokenizer_hash = check_pair(target_src, draft_src)  # before spending minutes on conversion
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ".gguf" if to == "gguf" else ""
    summaries = {}
    for role, src, quant in (("target", target_src, target_quant), ("draft", draft_src, draft_quant)):
        summaries[role] = export_source(src, to, quant, out_dir / f"{role}-{quant}{suffix}",
                                        progress=progress, parity=parity)
    manifest = write_manifest(out_dir, to, tokenizer_hash, summaries["target"], summaries["draft"])
    return {"manifest": str(manifest), "tokenizer_hash": tokenizer_hash, **summaries}
