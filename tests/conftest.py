import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402


def _pin_worker() -> None:
    """Under pytest-xdist (`make test` runs a worker a core, up to 4), each worker on its own share of the cores,
    before torch or llama.cpp start threads: their default thread counts follow it (edgespec.machine.cores), so
    the workers' threads never wait on each other's cores (a model's spinning threads on shared cores ran the
    EAGLE law tests about 4x slower: docs/results/2026-11-30-test-workers.md). Outside xdist nothing changes."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit()) or not hasattr(os, "sched_setaffinity"):
        return
    mine = sorted(os.sched_getaffinity(0))
    share = max(len(mine) // int(count), 1)
    start = int(worker[2:]) * share % len(mine)
    os.sched_setaffinity(0, mine[start:start + share])


_pin_worker()

# files whose tests share a session fixture too slow to build on each worker: one worker runs them all
# (smollm2_onnx_fp32, the real model's ONNX export: about 80 s on a worker's one core)
SHARED_SESSION = {"tests/real/test_export_onnx.py": "onnx-export", "tests/real/test_onnx_backend.py": "onnx-export"}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist (-p no:xdist) has none
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s workers take a test file at a time (its module fixtures built once), the files of
    SHARED_SESSION together."""
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SHARED_SESSION.get(file, file)

    return ByFile(config, log)

CHECKPOINT_VERSION = 1  # bump when models/smollm2.py changes what it writes
# under CI (.ci/run sets CI=true) a piece `make install` brings and this machine lacks (the C row passes, Chromium,
# playwright) fails the tests that need it; elsewhere they skip, saying why. A GPU is not such a piece.
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# hypothesis under CI: the same examples on every run (derandomized, no example database in the checkout), and a
# failure prints the blob that reproduces it; a test's own @settings (its max_examples) still hold
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
if ON_CI:
    hypothesis_settings.load_profile("ci")

# Tests come in three tiers, a folder each (docs/testing.md): fast/ (pure functions and the loop on fake backends: make
# test-fast, under a minute), laws/ (the exact rule drawn thousands of times a test against the target's law, each
# beside a broken rule it must catch) and real/ (real models, exports, torch, servers). A test is marked with its
# folder's tier, so `-m laws` or `-m "not real"` select across folders. The helpers every tier shares (fake.py,
# stats_util.py) stay here, and each tier's modules can import the others' helpers by name.
TESTS = Path(__file__).parent
TIERS = ("fast", "laws", "real")
sys.path[1:1] = [str(TESTS / tier) for tier in TIERS]
# the fixtures that build or open real models: a test outside real/ that asks for one is in the wrong folder
REAL_FIXTURES = frozenset({"default_gguf", "q4_0_gguf", "padded_gguf", "padded_q4_0_gguf", "retokenized_q4_0_gguf",
                           "smollm2_checkpoint", "reference_pair", "smollm2_onnx_fp32", "tiny_checkpoint",
                           "default_corpus", "subset_gguf"})


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        tier = item.path.parent.name
        if tier not in TIERS:
            misplaced.append(f"{item.nodeid}: not in a tier's folder (tests/{{{','.join(TIERS)}}}/)")
            continue
        if tier != "fast":
            item.add_marker(getattr(pytest.mark, tier))
        real = sorted(REAL_FIXTURES.intersection(item.fixturenames))
        if real and tier != "real":
            misplaced.append(f"{item.nodeid}: asks for {', '.join(real)}, a real model: it belongs in tests/real/")
    if misplaced:
        raise pytest.UsageError("tests in the wrong tier:\n" + "\n".join(misplaced))


@pytest.fixture(scope="session")
def default_gguf():
    from edgespec.models.default import default_target

    return default_target()


@pytest.fixture(scope="session")
def q4_0_gguf(default_gguf, tmp_path_factory):
    """A second GGUF of the default model (re-quantized to Q4_0): a real draft with the same vocabulary."""
    from edgespec.backends.llama.lib import quantize_gguf

    return quantize_gguf(default_gguf, tmp_path_factory.mktemp("models") / "smollm2-q4_0.gguf", "q4_0")


@pytest.fixture(scope="session")
def padded_gguf(default_gguf, tmp_path_factory):
    """The default model with its vocabulary padded by 128 unused ids (zero rows), as Qwen2.5 7B-72B pad
    151,936 tokens to 152,064: a padded target for the default model's drafts."""
    from edgespec.models.vocab_edit import pad_vocab

    return pad_vocab(default_gguf, tmp_path_factory.mktemp("models") / "smollm2-padded.gguf", 49152 + 128)


@pytest.fixture(scope="session")
def padded_q4_0_gguf(q4_0_gguf, tmp_path_factory):
    """q4_0_gguf padded by 128 ids: a draft with more ids than the default target."""
    from edgespec.models.vocab_edit import pad_vocab

    return pad_vocab(q4_0_gguf, tmp_path_factory.mktemp("models") / "smollm2-q4_0-padded.gguf", 49152 + 128)


@pytest.fixture(scope="session")
def retokenized_q4_0_gguf(q4_0_gguf, tmp_path_factory):
    """q4_0_gguf under another tokenizer: its ids shuffled and 2000 of its tokens dropped, so it spells some
    words with more tokens than the target and numbers every token otherwise (a draft of another family)."""
    from edgespec.models.vocab_edit import permute_vocab

    return permute_vocab(q4_0_gguf, tmp_path_factory.mktemp("models") / "smollm2-q4_0-retokenized.gguf", seed=3,
                         drop=2000)


@contextlib.contextmanager
def models_cache():
    """The folder of models the tests build once per machine (EDGESPEC_TEST_CACHE, default
    ~/.cache/edgespec/test-checkpoints), held under a lock: of the workers of one `make test` that want a model
    not built yet, one builds it and the others wait and use it."""
    cache = Path(os.environ.get("EDGESPEC_TEST_CACHE", Path.home() / ".cache" / "edgespec" / "test-checkpoints"))
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield cache


@pytest.fixture(scope="session")
def smollm2_checkpoint():
    """The real SmolLM2-135M-Instruct as a Hugging Face folder (dequantized from the shipped GGUF).

    Built once per machine into EDGESPEC_TEST_CACHE (default ~/.cache/edgespec/test-checkpoints), since
    it takes about 25 s and 540 MB; build_checkpoint writes it atomically, so a stale half is impossible.
    """
    from edgespec.models.smollm2 import build_checkpoint

    with models_cache() as cache:
        return build_checkpoint(cache / f"smollm2-135m-instruct-{CHECKPOINT_VERSION}")


@pytest.fixture(scope="session")
def reference_pair(smollm2_checkpoint):
    """(target, draft): SmolLM2-135M f32 + q4_0 as `make pair` builds them (without the parity check), cached
    beside the checkpoint (EDGESPEC_TEST_CACHE) since the export takes about 20 s and 630 MB."""
    from edgespec.export import export_pair
    from edgespec.export.pair import read_manifest

    with models_cache() as cache:
        folder = cache / f"smollm2-f32-q4_0-{CHECKPOINT_VERSION}"
        if (folder / "pair.json").is_file():
            return tuple(str(p) for p in read_manifest(folder / "pair.json"))
        work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache))
        try:
            export_pair(str(smollm2_checkpoint), str(smollm2_checkpoint), "gguf", work, target_quant="f32",
                        draft_quant="q4_0", progress=False, parity=False)
            shutil.rmtree(folder, ignore_errors=True)  # a stale half, if any
            os.replace(work, folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return tuple(str(p) for p in read_manifest(folder / "pair.json"))


@pytest.fixture(scope="session")
def smollm2_onnx_fp32(smollm2_checkpoint, tmp_path_factory):
    """SmolLM2-135M exported to ONNX float32 with its parity report (about 60 s), shared by the export's tests
    and the ONNX backend's: export_onnx's summary ("path", "parity", "weight_bytes")."""
    from edgespec.export.onnx import export_onnx

    return export_onnx(smollm2_checkpoint, tmp_path_factory.mktemp("smollm2-onnx") / "fp32", "fp32", progress=False)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny random Llama checkpoint with SmolLM2's tokenizer: fast export and parity tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from edgespec.models.smollm2 import save_tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, rope_theta=10000.0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper than the default init, so greedy choices are not near-ties
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def soft_llama(folder: Path, layer_scale: float = 1.0, hidden_size: int = 64) -> Path:
    """A tiny random 3-layer Llama with SmolLM2's tokenizer and soft distributions (a 1-layer draft starts
    measurably away from it); layer_scale multiplies its decoder layers' linear weights, hidden_size sets its
    width (64; one that is not a multiple of 32 cannot be rounded in GGUF blocks)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from edgespec.models.smollm2 import save_tokenizer

    config = LlamaConfig(vocab_size=49152, hidden_size=hidden_size, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(1)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
        for m in model.model.layers.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(layer_scale)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder


# a prompt whose continuation prompt lookup finds in it, and whose first tokens spread over several ids at t = 1: the
# real models' checks of the target's exact law draw their first tokens after it
REPEATING = "red green blue, red green blue, red green blue, red green"
CORPUS_PROMPTS = [{"cat": "chat", "prompt": "Say hello."}, {"cat": "code", "prompt": "Write a Python add function."},
                  {"cat": "math", "prompt": "What is 7 times 6?"}]


@pytest.fixture(scope="session")
def default_corpus(default_gguf, tmp_path_factory):
    """The default model's greedy answers to three prompts, with top-32 logits and hidden states."""
    from edgespec.train.corpus import build_corpus

    out = tmp_path_factory.mktemp("corpus") / "default"
    build_corpus(default_gguf, CORPUS_PROMPTS, out, max_tokens=12, hidden=True, shard_size=2, progress=False)
    return out


@pytest.fixture(scope="session")
def subset_gguf(q4_0_gguf, tmp_path_factory):
    """The Q4_0 draft drafting from the vocabulary's first 8192 ids (a BPE vocabulary's most frequent tokens come
    first), as edgespec draft-vocab writes it."""
    import numpy as np

    from edgespec.backends.llama.subset import write_subset

    return write_subset(q4_0_gguf, tmp_path_factory.mktemp("models") / "smollm2-q4_0-s8k.gguf", np.arange(8192))


def streams_draft_as_one(target, draft: str, prompts: list[str], **options) -> None:
    """A draft inside llama.cpp (an EAGLE-3 head, a DFlash draft, an MTP layer) on two streams sharing its decoder
    context (drafts/llama_head.for_streams), greedy at a fixed draft length: each answer is target-only's, its
    drafts kept where one stream's are, and where the decoder keeps a law of its newest entry (EAGLE-3, MTP) each
    stream's ends on the one a stream alone ends on with the same text: each stream's drafter reads its own
    stream's rows of the joined passes. The target should be one whose rows move by rounding only between passes
    of other shapes (f32), or greedy near-ties may flip."""
    import numpy as np

    import edgespec
    from edgespec.parallel import Parallel

    options = {"max_tokens": 24, "temperature": 0, "draft_max": 3, **options}
    with Parallel(target, draft, streams=2, n_ctx=256) as p:
        assert len(p.heads.siblings) == 1 and p.engines[1].drafter.seq == 1
        before = p.target.decodes
        results = p.generate([{"prompt": prompt, **options} for prompt in prompts])
        assert p.target.decodes - before - len(prompts) < sum(r.stats.target_passes for r in results)  # joined
        ends = {tuple(e.drafter.context): e.drafter.last[1].copy() for e in p.engines if e.drafter.last is not None}
    one, plain = edgespec.load(target, draft, n_ctx=256), edgespec.load(target, None, n_ctx=256)
    laws = []
    for prompt, result in zip(prompts, results, strict=True):
        alone = one.generate(prompt, **options)
        assert result.tokens == alone.tokens == plain.generate(prompt, **{**options, "draft_max": 0}).tokens
        assert (result.stats.drafted, result.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
        assert result.stats.drafted > 0
        if one.drafter.last is not None:
            laws.append(one.drafter.last[1])
            assert np.abs(ends[tuple(one.drafter.context)] - laws[-1]).max() < 1e-3 * np.ptp(laws[-1])
    if laws:  # the two texts' laws differ: the check above has teeth
        assert np.abs(laws[0] - laws[1]).max() > 0.1 * np.ptp(laws[1])
    one.close()
    plain.close()
