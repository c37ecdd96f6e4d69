"""A simulated device: backends whose passes cost what a device's table says, on a virtual clock, and whose
logits follow a script, so the draft-length controller can be judged on any device's costs at a set acceptance,
deterministically and in milliseconds of real time (tests/fast/test_controller_sim.py, benchmarks/controller_sim.py).

The text is written in advance: the target's row at position i puts its mass on script[i + 1], so greedy
decoding emits the script whatever is drafted, and only the time it takes depends on the drafts. A draft (a
draft model's backend, or heads) puts its mass on `picks[i + 1]`: the script's token with probability alpha,
drawn once per position, else another. For prompt lookup the script itself carries the acceptance
(`copy_script`): the text copies its prompt and skips a token with probability 1 - alpha, so lookup always has
a proposal and each of its tokens is right with probability alpha, independently.

Time passes only inside a model: a target pass advances the clock by the device table's seconds for that many
tokens, a draft model's pass by a step and what reading each further token costs, a head by its step. The
loop's own work (sampling, bookkeeping) takes no virtual time: the simulation judges the controller's choices,
not the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.backends.protocol import MAX_OUTPUTS, Backend, Vocab, check_forward
from edgespec.decode.calibrate import measure_pass_costs, measure_read_cost
from edgespec.decode.cost import DraftController
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams
from edgespec.decode.shape import RankAcceptance
from edgespec.drafts.base import Drafter, ModelDrafter, PromptLookupDrafter, chain_with_siblings, grow_tree

EOS = 0  # never in a script
TARGET_TOP = 0.99  # the target's top probability at every position (greedy decoding reads only the argmax)
DRAFT_TOP = 0.5  # a draft's confidence at every position: it says nothing of which drafts are right


@dataclass(frozen=True)
class Device:
    """What a device charges, in seconds."""

    name: str
    target: dict[int, float]  # tokens in a target pass -> seconds (some lengths; the rest from pass_seconds)
    draft_step: float  # a draft model's pass over one token
    draft_read: float  # each further token of a draft model's pass (catching up on text it did not read)
    head_token: float  # a head step
    source: str = ""  # where the figures come from


class VirtualClock:
    """Seconds that pass only when a simulated pass says so. Calling it reads the time (the loop's `clock`)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def pass_seconds(table: dict[int, float], n: int) -> float:
    """Seconds for a pass of n tokens from a table of some lengths: linear between the lengths it has, and past
    the longest along the slope of its last two (a pass of one token more costs what the widest step did)."""
    lengths = sorted(table)
    if n <= lengths[-1]:
        return float(np.interp(n, lengths, [table[m] for m in lengths]))
    if len(lengths) == 1:
        return table[lengths[0]] * n / lengths[0]
    a, b = lengths[-2], lengths[-1]
    return table[b] + (table[b] - table[a]) / (b - a) * (n - b)


def random_script(n_prompt: int, n_new: int, n_vocab: int, rng: np.random.Generator) -> list[int]:
    """A prompt and the text after it, tokens drawn uniformly from 1..n_vocab-1 (for drafts that ignore the text)."""
    return rng.integers(1, n_vocab, n_prompt + n_new).tolist()


def copy_script(n_new: int, alpha: float, rng: np.random.Generator, burst: float = 0.0) -> tuple[list[int], int]:
    """A prompt and n_new tokens after it, on which prompt lookup's tokens are right with probability alpha each.

    The prompt is 2 * n_new + 2 distinct tokens in a random order, then its first token again. The text copies
    it: after the prompt's i-th token comes its (i + 1)-th with probability alpha, else its (i + 2)-th. The copy
    only moves forward, so every n-gram ending at the text's last token occurred earlier in the prompt alone,
    and lookup proposes the tokens after it there: the first is right with probability alpha, and each next one
    with probability alpha once those before it were. Returns (prompt + text, prompt length); ids are
    1..2 * n_new + 2 (0 is EOS). burst in [0, 1): lookup is right in runs, as where text repeats itself: whether
    a token is right depends on the last (a Markov chain that keeps acceptance alpha on average, the chance of
    staying right or wrong raised by burst of the way to 1); 0 is independent."""
    source = (rng.permutation(2 * n_new + 2) + 1).tolist()
    at, text, right = 0, [], rng.random() < alpha
    for u in rng.random(n_new):
        right = u < (alpha + burst * (1 - alpha) if right else alpha * (1 - burst))
        at += 1 if right else 2
        text.append(source[at])
    return [*source, source[0], *text], len(source) + 1


def draft_picks(script: Sequence[int], n_prompt: int, alpha: float, n_vocab: int,
                rng: np.random.Generator) -> np.ndarray:
    """What a draft puts its mass on at each position [len(script) + MAX_OUTPUTS + 1]: after the prompt, the
    script's token with probability alpha, else another one (never EOS); past the script, token 1."""
    script = np.asarray(script)
    wrong = script % (n_vocab - 1) + 1  # another id in 1..n_vocab-1
    right = rng.random(len(script)) < alpha
    right[:n_prompt] = True
    return np.concatenate([np.where(right, script, wrong), np.ones(MAX_OUTPUTS + 1, dtype=script.dtype)])


def draft_ranks(script: Sequence[int], n_prompt: int, alpha: float, n_vocab: int, rng: np.random.Generator,
                width: int) -> np.ndarray:
    """A draft's first `width` guesses at each position [len(script) + MAX_OUTPUTS + 1, width], for heads that draft
    trees: column 0 is draft_picks' (the script's token with probability alpha); where it is wrong, the script's
    token is guess r with the chance decode/shape.RANK_SHARES gives (what the reference pair's draft showed), else
    no guess has it. Every other guess is an id of its own (never EOS, never the script's)."""
    picks = draft_picks(script, n_prompt, alpha, n_vocab, rng)
    n = len(picks)
    ranks = np.empty((n, width), dtype=picks.dtype)
    ranks[:, 0] = picks
    padded = np.concatenate([np.asarray(script), np.ones(n - len(script), dtype=picks.dtype)])
    kept = RankAcceptance().kept(alpha)[1:width]
    where = rng.random(n)  # which later guess holds the script's token where the first missed
    bounds = np.cumsum(kept) / (1.0 - alpha) if alpha < 1 else np.ones(len(kept))
    for r in range(1, width):
        other = (padded + r) % (n_vocab - 1) + 1  # an id of its own for guess r (script % (V - 1) + 1 is column 0's)
        other = np.where(other == padded, other % (n_vocab - 1) + 1, other)
        hit = (picks != padded) & (where < bounds[r - 1]) & (where >= (bounds[r - 2] if r > 1 else 0.0))
        ranks[:, r] = np.where(hit, padded, other)
    return ranks


def sim_vocab(n_vocab: int) -> Vocab:
    texts = tuple(b"</s>" if i == EOS else b"t%d " % i for i in range(n_vocab))
    return Vocab(texts=texts, pieces=tuple(b"" if i == EOS else t for i, t in enumerate(texts)), bos_id=EOS,
                 eos_id=EOS, eog_ids=frozenset([EOS]))


class SimBackend(Backend):
    """A Backend whose row at cache position i puts probability `top` on picks[i + 1], and whose passes advance
    `clock` by `seconds(n tokens)`, times a lognormal factor of mean 1 where jitter (its sigma) is above 0."""

    def __init__(self, picks: Sequence[int], n_vocab: int, seconds: Callable[[int], float], clock: VirtualClock, *,
                 top: float,
                 n_ctx: int, name: str = "sim", jitter: float = 0.0, rng: np.random.Generator | None = None):
        self.picks = np.asarray(picks)
        self.vocab = sim_vocab(n_vocab)
        self.n_ctx, self.name = n_ctx, name
        self.tokens: list[int] = []
        self.seconds, self.clock = seconds, clock
        self.jitter, self.rng = jitter, rng or np.random.default_rng(0)
        self.passes: list[float] = []  # seconds of each forward
        self._tree: list[int] | None = None  # the tokens forward_tree passed, until keep_branch
        self._logit = float(np.log(top * (n_vocab - 1) / (1 - top)))  # softmax top probability = top

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        """Rows for the last n_logits positions (always a new array, whatever copy says)."""
        check_forward(self, len(tokens), n_logits, MAX_OUTPUTS)
        self._charge(len(tokens))
        self.tokens.extend(tokens)
        return rows(self.picks[len(self.tokens) - n_logits + 1:len(self.tokens) + 1], self.vocab.n_vocab, self._logit)

    def _charge(self, n: int) -> None:
        """A pass of n tokens: the clock advances by its seconds (times the jitter's factor)."""
        seconds = self.seconds(n)
        if self.jitter:
            seconds *= self.rng.lognormal(-self.jitter ** 2 / 2, self.jitter)
        self.clock.advance(seconds)
        self.passes.append(seconds)

    trees = True  # forward_tree, keep_branch

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Rows for a draft tree after the cache [n, V]: a node's row is its position's (its depth under tokens[0]),
        the pass priced as n tokens."""
        depths: list[int] = []
        for parent in parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        self._charge(len(tokens))
        self._tree = list(tokens)
        return rows(self.picks[len(self.tokens) + 1 + np.asarray(depths)], self.vocab.n_vocab, self._logit)

    def keep_branch(self, path: Sequence[int]) -> None:
        self.tokens.extend(self._tree[i] for i in path)
        self._tree = None

    def rollback(self, n_past: int) -> None:
        del self.tokens[n_past:]

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        raise NotImplementedError("a simulated backend runs token ids only")

    def chat_template(self) -> str | None:
        return None

    def memory(self) -> dict[str, int]:
        return {"weights": 0, "kv_cache": 0}


def rows(picks: np.ndarray, n_vocab: int, logit: float) -> np.ndarray:
    """Logits [len(picks), V]: `logit` on each pick, 0 elsewhere."""
    out = np.zeros((len(picks), n_vocab), dtype=np.float32)
    out[np.arange(len(picks)), picks] = logit
    return out


class SimHeads(Drafter):
    """Heads that draft like the EAGLE head (drafts/eagle.py): the first row comes with the round, each further
    one from a head step the gate asked for, each costing `seconds`. ranks[p]: its guesses at position p, best first
    (draft_ranks; one column: picks). Trees: every node at one depth is drafted by the same step (a head runs a
    depth's nodes at once), and any node may have children: a node's guesses depend on its position only."""

    gated = True
    trees = True
    branching = True

    def __init__(self, ranks: np.ndarray, n_vocab: int, seconds: float, clock: VirtualClock):
        self.ranks, self.n_vocab, self.seconds, self.clock = np.asarray(ranks), n_vocab, seconds, clock
        if self.ranks.ndim == 1:
            self.ranks = self.ranks[:, None]
        self.name = "sim-heads"
        self._logit = float(np.log(DRAFT_TOP * (n_vocab - 1) / (1 - DRAFT_TOP)))

    def _row(self, position: int) -> np.ndarray:
        """The head's logits [V] at `position`: its guesses a step apart, the first on top."""
        out = np.zeros(self.n_vocab, dtype=np.float32)
        guesses = self.ranks[position]
        out[guesses] = self._logit - np.arange(len(guesses), dtype=np.float32)
        return out

    def propose(self, context, k, params, rng, gate=None):
        if k == 0:
            return [], np.zeros((0, self.n_vocab))

        def row(i):  # the head's logits [V] for the draft at position len(context) + i
            self.clock.advance(self.seconds)
            return self._row(len(context) + i)

        tree = chain_with_siblings(row(0), lambda token, i: row(i + 1), k, 1, params, rng, self.n_vocab, gate=gate)
        return tree.tokens, tree.probs[:len(tree.tokens)]

    def propose_tree(self, context, shape, params, rng):
        stepped = set()

        def expand(path):  # the children of a node at depth len(path) sit at position len(context) + len(path)
            if len(path) not in stepped:  # one head step per depth
                stepped.add(len(path))
                self.clock.advance(self.seconds)
            return self._row(len(context) + len(path))

        return grow_tree(shape, expand, params, rng, self.n_vocab)


DRAFTS = ("lookup", "model", "heads")
PROMPT = 128  # prompt tokens before an answer drafted by a model or heads (lookup's prompts are its copy_script's)


@dataclass
class Outcome:
    """Totals over the answers of one simulated run, in the virtual clock's seconds."""

    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    drafting_rounds: int = 0

    @property
    def tokens_per_virtual_second(self) -> float:
        """Tokens over the simulated device's seconds (the VirtualClock): the same on every machine, however busy."""
        return self.tokens / self.seconds if self.seconds else 0.0


def simulate(device: Device, draft: str, alpha: float, *, draft_max: int | None = None, answers: int = 4,
             n_new: int = 256, k_max: int = 8, seed: int = 0, jitter: float = 0.0,
             prior: float | None = None, burst: float = 0.0, tree_width: int = 1) -> Outcome:
    """Greedy answers of n_new tokens through the loop on `device`, drafted by `draft` (one of DRAFTS) at
    acceptance alpha. draft_max: 0 target-only, k a fixed draft length, None the controller's choice. One
    controller serves every answer, built as api.load builds it: pass costs measured on the device (by the
    virtual clock), a draft model's step and reading cost measured, heads' cost given, a draft model's
    acceptance prior `prior` (None: alpha, as if the calibration text were like the answers). The answers' texts
    and draft picks depend on (seed, answer) only, so runs that differ in draft_max see the same ones. Time
    counts after the target's prefill: decoding, and a draft model reading the prompt (at prefill where the
    controller drafts from the start, before its first drafting round where not). jitter: the sigma of a
    lognormal factor of mean 1 on every model pass (head steps excepted). burst: prompt lookup right in runs
    (copy_script). tree_width above 1: heads draft trees of up to that many guesses a node (draft_ranks), in the
    shape the controller plans (or draft_max depths of that many each), the target's passes timed up to the
    longest one takes."""
    if draft not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}, got {draft!r}")
    clock = VirtualClock()

    def target_seconds(n):
        return pass_seconds(device.target, n)

    def draft_seconds(n):
        return device.draft_step + (n - 1) * device.draft_read

    def backend(picks, seconds, top, n_vocab, rng):
        return SimBackend(picks, n_vocab, seconds, clock, top=top, n_ctx=len(picks), jitter=jitter, rng=rng)

    calibration = np.arange(1, 4 * MAX_OUTPUTS)
    costs = measure_pass_costs(backend(calibration, target_seconds, TARGET_TOP, len(calibration) + 1,
                                       np.random.default_rng([seed, 1 << 20])),
                               min(k_max * tree_width + 1, MAX_OUTPUTS), clock=clock)
    draft_cost = {"lookup": 0.0, "heads": device.head_token}.get(draft, 0.0)
    if draft == "model":
        draft_backend = backend(calibration, draft_seconds, DRAFT_TOP, len(calibration) + 1,
                                np.random.default_rng([seed, 1 << 21]))
        draft_cost = measure_pass_costs(draft_backend, 1, clock=clock)[1]
    controller = DraftController(costs, draft_cost, k_max)
    if draft == "model":
        controller.read_cost = measure_read_cost(draft_backend, clock=clock)
        prior = alpha if prior is None else prior
        controller.set_prior(prior)

    outcome = Outcome()
    for answer in range(answers):
        rng = np.random.default_rng([seed, answer])
        n_vocab = 2 * n_new + 3
        if draft == "lookup":
            script, n_prompt = copy_script(n_new, alpha, rng, burst)
        else:
            script, n_prompt = random_script(PROMPT, n_new, n_vocab, rng), PROMPT
        if draft == "heads" and tree_width > 1:
            ranks = draft_ranks(script, n_prompt, alpha, n_vocab, rng, tree_width)
            picks = ranks[:, 0]
        else:
            ranks = picks = draft_picks(script, n_prompt, alpha, n_vocab, rng)
        target = backend(np.concatenate([script, np.ones(MAX_OUTPUTS + 1, dtype=int)]), target_seconds, TARGET_TOP,
                         n_vocab, np.random.default_rng([seed, answer, 1]))
        if draft == "lookup":
            drafter = PromptLookupDrafter(n_vocab)
        elif draft == "model":
            drafter = ModelDrafter(backend(picks, draft_seconds, DRAFT_TOP, n_vocab,
                                           np.random.default_rng([seed, answer, 2])), target.vocab)
        else:
            drafter = SimHeads(ranks, n_vocab, device.head_token, clock)
        stats = Stats()
        events = speculate(target, drafter, controller, script[:n_prompt], SamplingParams(temperature=0), rng,
                           max_tokens=n_new, draft_max=draft_max, stats=stats, clock=clock, tree_width=tree_width)
        if [e.token for e in events] != script[n_prompt:]:  # greedy decoding writes the script, whatever is drafted
            raise AssertionError(f"answer {answer} left the script: the loop is not exact")
        outcome.tokens += stats.generated
        outcome.seconds += stats.decode_s + stats.prefill_s - target.passes[0]  # the target's prefill left out
        outcome.drafted += stats.drafted
        outcome.accepted += stats.accepted
        outcome.rounds += stats.target_passes
        outcome.drafting_rounds += stats.target_passes - stats.draft_lengths[0]
    return outcome
