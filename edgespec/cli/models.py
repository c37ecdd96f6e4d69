"""Commands for models by hub name: pull, models; and the draft choice the run commands report."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("name")
@click.option("--revision", default=None, help="Branch, tag or commit [default: main, or NAME@REVISION]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: name, repository, commit, files, path")
def pull(name, revision, as_json):
    """Download the GGUF model NAME, org/repo[:QUANT], into the Hugging Face cache and print its path.

    QUANT (Q4_K_M, Q8_0, ...; any case) picks the file; without it, Q4_K_M, then Q4_0, then Q8_0, else the first
    GGUF. A model split in parts is downloaded whole; the path is its first part's. With HF_HUB_OFFLINE=1 the name
    is resolved from the cache alone. The path works as -m/--target or --draft, and so does NAME itself.
    """
    from edgespec.models import hub

    pulled = hub.pull(name, revision=revision, progress=True)
    if as_json:
        click.echo(json.dumps({"name": pulled.name, "repo": pulled.repo_id, "commit": pulled.commit,
                               "files": list(pulled.gguf.files), "quant": hub.quant_of(pulled.gguf.first),
                               "size": pulled.size, "path": str(pulled.path)}))
        return
    click.echo(f"{pulled.name}: {len(pulled.gguf.files)} file(s), {_size(pulled.size)}, commit {pulled.commit[:12]}",
               err=True)
    click.echo(str(pulled.path))


# a pair's kind, as the text listing words it: check_compatible's verdict on the two vocabularies (a draft of another
# tokenizer, translated token by token, would be a third kind, "cross-tokenizer")
PAIR_KINDS = {"exact": "exact vocabulary", "padded": "padded vocabulary", "cross-tokenizer": "another tokenizer"}


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print the models and pairs as JSON")
def models_cmd(as_json):
    """List the GGUF models in the Hugging Face cache, and the pairs of them that can run as target and draft.

    A pair is two models of different repositories, the draft the smaller; its kind says how their vocabularies
    pair, as at load: "exact" (the same tokens), "padded" (the same tokens on the ids both have, the sizes up to 128
    apart, as llama.cpp allows), or "cross-tokenizer" (another tokenizer, at least half of whose tokens spell a
    target token: drafted through those, drafts/cross.py; with `shared_tokens`). `--draft auto` with a target by
    hub name picks among the exact and padded ones. Reads the files' headers only.
    """
    from edgespec.backends.protocol import VOCAB_PADDING
    from edgespec.drafts.cross import MIN_SHARED, VocabMap
    from edgespec.errors import EdgespecError
    from edgespec.models import hub
    from edgespec.models.draft_search import gguf_vocab, pairing

    cached = hub.cached_models()
    vocabs = {}  # by path; None: not all parts cached, or unreadable
    for model in cached:
        try:
            vocabs[model.path] = gguf_vocab(model.path) if model.complete else None
        except EdgespecError:
            vocabs[model.path] = None
    heads = _llama_drafts(cached)
    kinds = {row["draft_path"]: row["kind"] for row in heads}
    pairs = []
    for target in cached:
        for draft in cached:
            vocab, draft_vocab = vocabs[target.path], vocabs[draft.path]
            if draft.repo_id == target.repo_id or draft.size >= target.size or not (vocab and draft_vocab) \
                    or kinds.get(str(target.path)) or kinds.get(str(draft.path)):  # heads pair in `heads`
                continue
            pair = {"target": target.name, "draft": draft.name, "size_ratio": round(target.size / draft.size, 1),
                    "vocabulary": pairing(vocab, draft_vocab)}
            if pair["vocabulary"] is None:  # another tokenizer: a pair where enough of its tokens spell the target's
                shared = VocabMap(vocab, draft_vocab).shared
                if shared < MIN_SHARED * draft_vocab.n_vocab:
                    continue
                pair.update(vocabulary="cross-tokenizer", shared_tokens=shared)
            pairs.append(pair)
    rows = [{"name": m.name, "repo": m.repo_id, "refs": list(m.refs), "commit": m.commit, "file": m.gguf.first,
             "files": list(m.gguf.files), "parts": m.gguf.parts, "quant": hub.quant_of(m.gguf.first), "size": m.size,
             "path": str(m.path), "n_vocab": vocabs[m.path].n_vocab if vocabs[m.path] else None,
             "vocab": vocabs[m.path].digest if vocabs[m.path] else None} for m in cached]
    heads = [{k: v for k, v in row.items() if k != "draft_path"} for row in heads]
    if as_json:
        click.echo(json.dumps({"cache": hub.cache_dir(), "offline": hub.offline(), "models": rows, "pairs": pairs,
                               "heads": heads}, indent=2))
        return
    click.echo(f"Hugging Face cache: {hub.cache_dir()}" + (" (HF_HUB_OFFLINE)" if hub.offline() else ""))
    if not rows:
        click.echo("no GGUF models cached: edgespec pull org/repo:QUANT")
        return
    width = max(len(r["name"]) for r in rows) + 2
    click.echo(f"{'name':{width}}{'quant':10}{'size':>10}  vocabulary  file")
    for r in rows:
        missing = r["parts"] - len(r["files"])
        vocab = (f"{r['vocab'][:8]} {r['n_vocab']:>6}" if r["vocab"]
                 else f"{missing} of {r['parts']} parts missing" if missing else "unreadable")
        click.echo(f"{r['name']:{width}}{r['quant'] or '-':10}{_size(r['size']):>10}  {vocab:15} {r['file']}")
    click.echo(f"\npairs (target <- draft; exact: the same vocabulary, padded: the same tokens, sizes up to "
               f"{VOCAB_PADDING} apart; another tokenizer: drafted through the tokens both spell):" if pairs
               else "\nno pairs: no two cached models of different repositories share enough tokens to draft")
    for p in pairs:
        shared = f", {p['shared_tokens']} tokens shared" if "shared_tokens" in p else ""
        click.echo(f"  {p['target']} <- {p['draft']} ({p['size_ratio']}x smaller, {PAIR_KINDS[p['vocabulary']]}"
                   f"{shared})")
    if heads:
        click.echo("\ndrafts in llama.cpp's formats (target <- --draft):")
    for h in heads:
        click.echo(f"  {h['target'] or '(no cached target)'} <- {h['draft']} ({h['what']})")


def _llama_drafts(cached) -> list[dict]:
    """The drafts in llama.cpp's own formats among cached models, each beside the cached targets it fits: an EAGLE-3
    head or DFlash draft with every target of the width it was converted for, and "mtp" for a target whose MTP
    layer --draft mtp drives (drafts/llama_kinds.py). Reads headers only."""
    from edgespec.drafts.llama_kinds import check_mtp, describe, gguf_meta
    from edgespec.errors import EdgespecError

    metas = {}
    for model in cached:
        try:
            metas[model.path] = gguf_meta(model.path) if model.complete else {}
        except EdgespecError:
            metas[model.path] = {}
    rows = []
    for target in cached:
        meta = metas[target.path]
        arch = meta.get("general.architecture")
        if describe(meta) or not arch:
            continue
        try:
            check_mtp(target.path)
            rows.append({"target": target.name, "draft": "mtp", "kind": "mtp", "draft_path": "mtp",
                         "what": f"its own MTP layer ({arch})"})
        except EdgespecError:
            pass
        for head in cached:
            what = describe(metas[head.path])
            head_arch = metas[head.path].get("general.architecture")
            width = metas[head.path].get(f"{head_arch}.target_hidden_size") or \
                metas[head.path].get(f"{head_arch}.embedding_length")
            if what and width == meta.get(f"{arch}.embedding_length"):
                rows.append({"target": target.name, "draft": head.name, "kind": head_arch,
                             "draft_path": str(head.path), "path": str(head.path), "what": what})
    for head in cached:  # a head no cached target fits is listed too, as one
        what = describe(metas[head.path])
        if what and not any(r.get("path") == str(head.path) for r in rows):
            rows.append({"target": None, "draft": head.name, "kind": metas[head.path]["general.architecture"],
                         "draft_path": str(head.path), "path": str(head.path),
                         "what": what + ": no cached target fits"})
    return rows


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def print_choice(choice: dict) -> None:
    """A status line (stderr) for a draft auto chose: which, and why; nothing for one asked for."""
    if choice.get("auto"):
        click.echo(f"draft (auto): {choice['draft']}: {choice['reason']}", err=True)
