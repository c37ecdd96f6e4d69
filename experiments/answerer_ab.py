"""Does the answerer matter? Two EAGLE heads trained on the same prompts, one on the target's own answers and
one on answers a quantization of the target wrote, tested on held-out prompts' own answers (first draft step,
teacher-forced), beside any heads given with --also.

    python experiments/answerer_ab.py --target target-f32.gguf --own OWN.corpus --other Q4.corpus \\
        [--epochs 4] [--also f32-1800.eagle.npz]

At full scale, against a head already trained on all of OTHER (train-heads' split: seed 0, 10 % held out):
only the own-answer head is trained, on the own answers of the prompts that head trained on, and both are
tested on the own answers of the prompts it held out (--save keeps the new head).

    python experiments/answerer_ab.py --target target-f32.gguf --own OWN.corpus --other Q4.corpus \\
        --against f32-1800.eagle.npz --epochs 5 --save f32-1800-own.eagle.npz

OWN may be a corpus still being built: its finished shards are read. Prompts are matched by their tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from head_agreement import first_step_hits

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.drafts.eagle import EagleDrafter
from edgespec.train.corpus import MANIFEST, holdout_split, read_corpus
from edgespec.train.eagle import fit_eagle


def finished_shards(folder: Path, view: Path):
    """A corpus's finished shards, read through a view that calls them complete."""
    manifest = json.loads((folder / MANIFEST).read_text())
    shards = sorted(p.name for p in folder.glob("shard-*.npz"))
    (view / MANIFEST).write_text(json.dumps({**manifest, "complete": True, "shards": shards}))
    for name in shards:
        os.symlink(folder.resolve() / name, view / name)
    return read_corpus(view)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--own", required=True, help="corpus of the target's own answers")
    parser.add_argument("--other", required=True, help="corpus of the same prompts answered by another model")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--also", action="append", default=[], help="a trained head to test beside (repeatable)")
    parser.add_argument("--against", help="a head trained on all of --other: train only the own-answer head")
    parser.add_argument("--save", help="with --against: where to keep the own-answer head")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        own = finished_shards(Path(args.own), Path(tmp))
        if args.against:
            against(args, own, read_corpus(args.other)[1], Path(tmp))
            return
        other = {tuple(s.tokens[:s.n_prompt]): s for s in read_corpus(args.other)[1]}
        pairs = [(s, other[tuple(s.tokens[:s.n_prompt])]) for s in own if tuple(s.tokens[:s.n_prompt]) in other]
        order = np.random.default_rng(1).permutation(len(pairs))
        n_test = len(pairs) // 5
        test = [pairs[i][0] for i in order[:n_test]]
        train = [pairs[i] for i in order[n_test:]]
        print(f"{len(train)} training prompts ({sum(len(o.lse) for o, _ in train)} own positions, "
              f"{sum(len(q.lse) for _, q in train)} other), {n_test} test prompts {dict(Counter(s.cat for s in test))}")
        backend = LlamaBackend(args.target, n_ctx=16)
        meta = {"vocab_digest": backend.vocab.digest, "n_embd": backend.n_embd}
        backend.close()
        heads = {}
        for name, seqs in (("own answers", [o for o, _ in train]), ("other answers", [q for _, q in train])):
            heads[name] = Path(tmp) / f"{name.split()[0]}.eagle.npz"
            report = fit_eagle(args.target, seqs, heads[name], meta, epochs=args.epochs, steps=3, lr=1e-3, batch=2,
                               holdout=0.05, progress=False)
            print(f"{name}: held-out agreement on its own kind of text {report['epochs'][-1]['held_out_agreement']}")
        heads.update({Path(p).name: Path(p) for p in args.also})
        compare(args.target, heads, test)


def against(args, own, other_seqs, tmp: Path) -> None:
    held_out, _ = holdout_split(other_seqs, 0.1, np.random.default_rng(0))  # train_eagle's split of the other corpus
    held = {tuple(s.tokens[:s.n_prompt]) for s in held_out}
    test = [s for s in own if tuple(s.tokens[:s.n_prompt]) in held]
    train = [s for s in own if tuple(s.tokens[:s.n_prompt]) not in held]
    print(f"{len(train)} training prompts ({sum(len(s.lse) for s in train)} own positions), {len(test)} test "
          f"prompts {dict(Counter(s.cat for s in test))}", flush=True)
    backend = LlamaBackend(args.target, n_ctx=16)
    meta = {"vocab_digest": backend.vocab.digest, "n_embd": backend.n_embd}
    backend.close()
    path = Path(args.save) if args.save else tmp / "own.eagle.npz"
    report = fit_eagle(args.target, train, path, meta, epochs=args.epochs, holdout=0.05, progress=True)
    print("own answers: held-out agreement per epoch",
          [e["held_out_agreement"] for e in report["epochs"]], flush=True)
    heads = {"own answers": path, Path(args.against).name: Path(args.against)}
    heads.update({Path(p).name: Path(p) for p in args.also})
    compare(args.target, heads, test)


def compare(target_path: str, heads: dict[str, Path], test) -> None:
    """First-step agreement of each head with the target's greedy choice on the test sequences, per category."""
    target = LlamaBackend(target_path, n_ctx=1024, hidden=True)
    for name, path in heads.items():
        drafter = EagleDrafter(path, target)
        per = defaultdict(lambda: [0, 0])
        for s in test:
            hits, n = first_step_hits(drafter, [int(t) for t in s.tokens], s.n_prompt, s.hidden, s.topk_ids[:, 0])
            for key in (s.cat, "overall"):
                per[key][0] += hits
                per[key][1] += n
        print(f"{name:<24}", "  ".join(f"{c} {h / max(n, 1):.3f}" for c, (h, n) in sorted(per.items())), flush=True)
    target.close()


if __name__ == "__main__":
    main()
