"""A training corpus for drafts: the target's own answers to a prompt set, with what the target thought.

For each prompt the target answers through edgespec's own engine (speculative decoding with prompt
lookup: the answer is distributed exactly as the target's), or a faster model sharing its vocabulary
answers (`answerer`: a quantization of the target writes nearly the target's text at a fraction of the
time, and the draft learns the target's distributions either way). Then one teacher-forced target pass
over prompt + answer records, at every position that predicts an answer token, the target's top-K logits and the
log-sum-exp of the whole row (so the top-K probabilities are exact, not renormalised), and, when asked,
the target's final hidden state there (what Medusa and EAGLE heads read).

On disk: a folder with corpus.json (settings, target, shard list) and shard-NNNNN.npz files, each
written under a temporary name and renamed when complete. Building again with the same settings skips
finished shards, so an interrupted build resumes; other settings are refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgespec.backends.protocol import MAX_OUTPUTS, check_compatible, forward_rows
from edgespec.errors import EdgespecError
from edgespec.progress import Steps

MANIFEST = "corpus.json"
VERSION = 1


@dataclass(frozen=True)
class CorpusSettings:
    target: str  # the model file or folder that answered
    target_size: int  # bytes of the target file: a different file is a different corpus
    max_tokens: int
    temperature: float
    top_k: int  # logits kept per position
    hidden: bool  # hidden states recorded
    shard_size: int  # prompts per shard
    seed: int
    prompts_digest: str
    answerer: str | None = None  # the model that wrote the answers, when not the target
    answerer_size: int = 0


def _digest(prompts: list[dict]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()[:16]


def _target_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else path.stat().st_size


STREAMS = 16  # prompts a GGUF model answers at once (LlamaBackend.answer_many; at most MAX_OUTPUTS)


def build_corpus(target: str | os.PathLike, prompts: list[dict], out: str | os.PathLike, *, max_tokens: int = 160,
                 temperature: float = 0.0, top_k: int = 32, hidden: bool = False, shard_size: int = 16,
                 seed: int = 0, n_ctx: int = 1024, threads: int | None = None, progress: bool = True,
                 answerer: str | os.PathLike | None = None, answer_draft: str | os.PathLike | None = None,
                 streams: int = STREAMS) -> dict:
    """Answer every prompt and record the target's logits there; return the manifest (also in out/corpus.json).

    temperature 0 records greedy answers; above 0, sampled ones (prompt i is seeded with seed + i).
    answerer: a model sharing the target's vocabulary and chat template that writes the answers instead of
    the target (the records are the target's all the same).
    streams: how many prompts a GGUF answering model answers at once (one pass reads the weights for all of
    them: 3.0x faster than one at a time with 16 streams on a 2-core CPU, experiments/answer_many.py).
    answer_draft: answer one prompt at a time through edgespec's engine, speculating with this draft (ONNX
    answering models always go one at a time, with prompt lookup). Neither changes what the answers are
    (sampled ones: what they are distributed as), so neither is a corpus setting: a build may resume with others.
    """
    target, out = Path(target), Path(out)
    answerer = Path(answerer) if answerer is not None else None
    if not prompts:
        raise EdgespecError("no prompts to build a corpus from")
    if answerer is not None and not answerer.exists():
        raise EdgespecError(f"the answering model {answerer} does not exist")
    if not 1 <= streams <= MAX_OUTPUTS:
        raise EdgespecError(f"streams must be between 1 and {MAX_OUTPUTS}, got {streams}")
    settings = CorpusSettings(str(target), _target_size(target), max_tokens, temperature, top_k, hidden,
                              shard_size, seed, _digest(prompts), str(answerer) if answerer else None,
                              _target_size(answerer) if answerer else 0)
    was_there, fresh = out.exists(), not (out / MANIFEST).is_file()
    manifest = _open_manifest(out, settings)
    shards = [prompts[i:i + shard_size] for i in range(0, len(prompts), shard_size)]
    todo = [i for i in range(len(shards)) if not (out / _shard_name(i)).is_file()]
    if todo:
        from edgespec.api import load, prompt_tokens
        from edgespec.backends.open import is_onnx, open_model

        model = answerer or target
        one_at_a_time = answer_draft is not None or streams == 1 or is_onnx(model)
        scorer = answering = None
        try:
            if one_at_a_time and answerer is None:  # the target's engine answers, and its backend scores
                answering = load(target, answer_draft or "ngram", n_ctx=n_ctx, threads=threads, hidden=hidden)
                scorer = answering.target
            else:
                scorer = open_model(target, n_ctx=n_ctx, threads=threads, hidden=hidden)
            asked = {i * shard_size + j: prompt_tokens(scorer, row["prompt"])
                     for i in todo for j, row in enumerate(shards[i])}
            if answering is None:
                answering = _open_answering(model, scorer, answer_draft, one_at_a_time=one_at_a_time, n_ctx=n_ctx,
                                            room=max(map(len, asked.values())) + max_tokens, streams=streams,
                                            threads=threads)
        except BaseException:
            _close(answering, scorer)
            if fresh:  # a corpus this call began: models that do not load leave nothing behind
                (out / MANIFEST).unlink()
                if not was_there:
                    out.rmdir()
            raise
        # minutes per shard on a CPU: a bar over prompts, starting at what earlier runs did
        bar = Steps(len(prompts), f"{(answerer or target).name} answering prompts", progress,
                    done=len(prompts) - len(asked))
        scored: dict[int, dict] = {i: {} for i in todo}  # shard -> its prompts' records so far

        def record(index: int, answer: list[int], ended: bool) -> None:
            shard, j = divmod(index, shard_size)
            scored[shard][j] = _score(scorer, asked[index], answer, ended, shards[shard][j], settings, index)
            if len(scored[shard]) == len(shards[shard]):  # written as soon as complete: a stop loses little
                done = scored.pop(shard)
                _write_shard(out, shard, _shard_arrays([done[j] for j in range(len(shards[shard]))]))
            bar.step()

        try:
            _answer(answering, asked, {i: prompts[i]["prompt"] for i in asked}, settings, streams, record)
        finally:
            _close(answering, scorer)
            bar.finish()
    manifest["shards"] = [_shard_name(i) for i in range(len(shards))]
    manifest["complete"] = True
    manifest["positions"] = sum(int(np.load(out / name)["lse"].shape[0]) for name in manifest["shards"])
    _write_json(out / MANIFEST, manifest)
    return manifest


def _open_manifest(out: Path, settings: CorpusSettings) -> dict:
    path = out / MANIFEST
    if path.is_file():
        manifest = json.loads(path.read_text())
        saved = {"answerer": None, "answerer_size": 0, **manifest.get("settings", {})}  # older corpora: the target
        if saved != json.loads(json.dumps(asdict(settings))):
            raise EdgespecError(f"{out} holds a corpus built with other settings or prompts: use a new folder "
                                "(or delete it to rebuild)")
        return manifest
    if out.exists() and any(out.iterdir()):
        raise EdgespecError(f"{out} exists, is not empty and is not a corpus: choose a new folder")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"version": VERSION, "settings": asdict(settings), "complete": False}
    _write_json(path, manifest)
    return manifest


def _open_answering(model: Path, scorer, draft, *, one_at_a_time: bool, n_ctx: int, room: int, streams: int,
                    threads: int | None):
    """What writes the answers when it is not the scorer's own engine: edgespec's engine answering one at a time,
    or a GGUF model answering `streams` prompts at once (room cells each); checked against the scorer."""
    from edgespec.api import load
    from edgespec.backends.open import open_model

    if one_at_a_time:
        answering = load(model, draft or "ngram", n_ctx=n_ctx, threads=threads)
        vocab, template = answering.target.vocab, answering.target.chat_template()
    else:
        answering = open_model(model, n_ctx=streams * room, threads=threads)
        vocab, template = answering.vocab, answering.chat_template()
    try:
        check_compatible(scorer.vocab, vocab)
        if template != scorer.chat_template():
            raise EdgespecError(f"{model.name} has another chat template than the target: its prompts would be "
                                "other tokens; answer with a model of the target's family")
    except BaseException:
        answering.close()
        raise
    return answering


def _close(answering, scorer) -> None:
    """Close what build_corpus opened (the scorer may be the answering engine's own target)."""
    if answering is not None:
        answering.close()
    if scorer is not None and scorer is not getattr(answering, "target", None):
        scorer.close()


def _answer(answering, asked: dict[int, list[int]], texts: dict[int, str], settings: CorpusSettings, streams: int,
            record) -> None:
    """Answer every prompt of `asked` (index -> its tokens; texts: index -> its text), calling
    record(index, answer, ended_on_eog) as each ends."""
    from edgespec.decode.sampling import SamplingParams, sample, to_probs

    order = list(asked)
    if hasattr(answering, "answer_many"):
        params = SamplingParams(temperature=settings.temperature)
        rngs = {i: np.random.default_rng(settings.seed + i) for i in order}

        def pick(k: int, logits: np.ndarray) -> int:
            return int(np.argmax(logits)) if params.greedy else sample(to_probs(logits, params), rngs[order[k]])

        answering.answer_many([asked[i] for i in order], settings.max_tokens, pick, streams=streams,
                              on_answer=lambda k, answer, ended: record(order[k], answer, ended))
        return
    for i in order:
        result = answering.generate(texts[i], max_tokens=settings.max_tokens,
                                    temperature=settings.temperature, seed=settings.seed + i)
        record(i, result.tokens, result.stats.finish_reason == "stop")


def _score(scorer, prompt: list[int], answer: list[int], ended: bool, row: dict, settings: CorpusSettings,
           index: int) -> dict:
    """One prompt's record: its tokens and what the target thought at every position of its answer."""
    seq = prompt + answer
    if ended:
        # no stop strings were given, so the answer ended on an end-of-generation token, which answers leave
        # out; the draft must learn to predict it too (EOS is the usual one; others are rare)
        seq.append(scorer.vocab.eos_id)
    if len(seq) > scorer.n_ctx:
        raise EdgespecError(f"prompt {index} and its answer outgrow the context of {scorer.n_ctx}")
    top_ids, top_logits, lse, hidden = teacher_forced(scorer, seq, len(prompt), settings.top_k)
    return {"seq": seq, "n_prompt": len(prompt), "cat": row.get("cat", "all"), "topk_ids": top_ids,
            "topk_logits": top_logits, "lse": lse, "hidden": hidden}


def _shard_arrays(records: list[dict]) -> dict:
    offsets = np.cumsum([0] + [len(r["seq"]) for r in records])
    arrays = {"tokens": np.asarray([t for r in records for t in r["seq"]], np.int32),
              "offsets": offsets.astype(np.int64),
              "prompt_lens": np.asarray([r["n_prompt"] for r in records], np.int32),
              "cats": np.asarray([r["cat"] for r in records])}
    for key in ("topk_ids", "topk_logits", "lse"):
        arrays[key] = np.concatenate([r[key] for r in records])
    if records[0]["hidden"] is not None:
        arrays["hidden"] = np.concatenate([r["hidden"] for r in records])
    return arrays


def teacher_forced(backend, seq: list[int], n_prompt: int, top_k: int):
    """The target's view of `seq`: for each position n_prompt-1 .. len-2 (each predicts the next token),
    top-K ids [n, K] and logits [n, K] (largest first), the row's log-sum-exp [n], and hidden states
    [n, E] (float16) when the backend records them."""
    backend.rollback(0)
    if n_prompt > 1:
        backend.forward(seq[:n_prompt - 1], 0)
    ids, logits, lses, hiddens = [], [], [], []
    rest = seq[n_prompt - 1:-1]
    for rows in forward_rows(backend, rest):
        rows = rows.astype(np.float64)  # [T, V]
        top = np.argpartition(-rows, top_k - 1, axis=1)[:, :top_k]  # [T, K], unordered
        top_rows = np.take_along_axis(rows, top, axis=1)
        order = np.argsort(-top_rows, axis=1)
        ids.append(np.take_along_axis(top, order, axis=1).astype(np.int32))
        logits.append(np.take_along_axis(top_rows, order, axis=1).astype(np.float32))
        peak = rows.max(axis=1)
        lses.append((peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))).astype(np.float32))
        if backend.last_hidden is not None:
            hiddens.append(backend.last_hidden.astype(np.float16))
    backend.rollback(0)
    return (np.concatenate(ids), np.concatenate(logits), np.concatenate(lses),
            np.concatenate(hiddens) if hiddens else None)


def _shard_name(i: int) -> str:
    return f"shard-{i:05d}.npz"


def _write_shard(out: Path, i: int, arrays: dict) -> None:
    tmp = out / f".{_shard_name(i)}.partial.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, out / _shard_name(i))


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


@dataclass
class Sequence:
    tokens: np.ndarray  # [L] prompt + answer
    n_prompt: int
    cat: str
    topk_ids: np.ndarray  # [L - n_prompt, K]: positions n_prompt-1 .. L-2
    topk_logits: np.ndarray  # [L - n_prompt, K]
    lse: np.ndarray  # [L - n_prompt]
    hidden: np.ndarray | None  # [L - n_prompt, E]


def holdout_split(seqs: list, holdout: float, rng: np.random.Generator) -> tuple[list, list]:
    """(held-out, training) sequences, split by prompt: the prompts (in order of first appearance) are permuted
    by rng and the first `holdout` share of them held out (at least one when there are two or more), with every
    answer to them, so answers from several corpora to one prompt never straddle the split. Every trainer splits
    this way, so a benchmark given a trainer's seed knows which prompts its draft never saw; for one corpus of
    distinct prompts it is a permutation of its sequences."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(seqs):
        groups.setdefault(tuple(s.tokens[:s.n_prompt]), []).append(i)
    prompts = list(groups.values())
    order = rng.permutation(len(prompts))
    n_held = max(1, int(len(prompts) * holdout)) if len(prompts) > 1 else 0
    held = [seqs[i] for g in order[:n_held] for i in prompts[g]]
    return held, [seqs[i] for g in order[n_held:] for i in prompts[g]]


def complete_manifest(folder: Path) -> dict:
    """The manifest of a finished corpus; a clear error for a folder that is not one, or not finished."""
    path = folder / MANIFEST
    if not path.is_file():
        raise EdgespecError(f"{folder} is not a corpus (no {MANIFEST}): build one with edgespec distill/train-heads")
    manifest = json.loads(path.read_text())
    if not manifest.get("complete"):
        raise EdgespecError(f"the corpus in {folder} is incomplete: run the same command again to finish it")
    return manifest


def read_corpus(folder: str | os.PathLike) -> tuple[dict, list[Sequence]]:
    """The manifest and every sequence of a complete corpus."""
    folder = Path(folder)
    manifest = complete_manifest(folder)
    seqs = []
    for name in manifest["shards"]:
        z = np.load(folder / name)
        pos = 0
        for s in range(len(z["prompt_lens"])):
            toks = z["tokens"][z["offsets"][s]:z["offsets"][s + 1]]
            n_prompt = int(z["prompt_lens"][s])
            n = len(toks) - n_prompt
            seqs.append(Sequence(toks, n_prompt, str(z["cats"][s]), z["topk_ids"][pos:pos + n],
                                 z["topk_logits"][pos:pos + n], z["lse"][pos:pos + n],
                                 z["hidden"][pos:pos + n] if "hidden" in z else None))
            pos += n
    return manifest, seqs


def check_also(main: str | os.PathLike, also: list[str | os.PathLike]) -> None:
    """Before building `main`: the corpora to train beside it exist, are finished and are not `main` itself."""
    for folder in also:
        if Path(folder).resolve() == Path(main).resolve():
            raise EdgespecError(f"{folder} is the training corpus itself: give another corpus")
        complete_manifest(Path(folder))


def read_corpora(main: str | os.PathLike, also: list[str | os.PathLike]) -> list[Sequence]:
    """Every sequence of the corpus `main` and of the corpora `also` (for instance the target's sampled answers
    beside its greedy ones), which must be complete and scored by the same target file with the same records;
    another target's logits or states would teach a draft the wrong model."""
    manifest, seqs = read_corpus(main)
    want = manifest["settings"]
    for folder in also:
        other, more = read_corpus(folder)
        got = other["settings"]
        for key, what in (("target_size", "another target file scored it"), ("top_k", "it keeps another top-K"),
                          ("hidden", "it differs in keeping hidden states")):
            if got.get(key) != want.get(key):
                raise EdgespecError(f"{folder} cannot train beside {main}: {what} ({key} {got.get(key)} against "
                                    f"{want.get(key)})")
        seqs += more
    return seqs
