"""edgespec advise: the calibration replay follows the loop's own path, the walk's arithmetic, the statistics,
on fake pairs (many answers against the loop: laws/test_advise_laws.py; the command on the real model:
real/test_advise_real.py)."""

import functools

import numpy as np
import pytest
from fake import FakeBackend, controller, random_table
from scipy import stats
from test_eagle import HiddenFake as EagleTarget
from test_eagle import head_file
from test_heads import HiddenFake as MedusaTarget
from test_heads import heads_file

from edgespec.api import Engine
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter
from edgespec.drafts.eagle import EagleDrafter
from edgespec.drafts.heads import MedusaDrafter
from edgespec.plan import advise

V = 5
PROMPTS = [{"cat": c, "prompt": p} for c, p in [("x", "ab"), ("x", "dca"), ("y", "b"), ("y", "cc"), ("y", "dab")]]
UNIT_COSTS = advise.Costs({n: 1.0 for n in range(1, 17)}, 0.0, 0.0, 0.0, "unit")


def table(seed, sharpness=2.0):
    t = random_table(np.random.default_rng(seed), V, sharpness)
    t[:, 0] -= 1.5  # answers end, but not at once
    return t


def make_engine(kind, tmp_path):
    """A fake target and a drafter of each kind, sharing the target's vocabulary."""
    if kind == "model":
        target = FakeBackend(table(0))
        return Engine(target, ModelDrafter(FakeBackend(table(0) + table(1)), target.vocab), controller())
    if kind == "ngram":
        target = FakeBackend(table(0, 1.0))
        return Engine(target, PromptLookupDrafter(V), controller())
    if kind == "medusa":
        target = MedusaTarget(table(0))
        return Engine(target, MedusaDrafter(heads_file(tmp_path, target), target, output=np.eye(V)), controller())
    target = EagleTarget(table(0))
    embeddings = np.random.default_rng(2).normal(size=(V, 6)).astype(np.float32)
    return Engine(target, EagleDrafter(head_file(tmp_path, target, range(V)), target, embeddings=embeddings),
                  controller())


@pytest.mark.parametrize("kind", ["model", "ngram", "medusa", "eagle"])
def test_greedy_replay_is_the_loop_path(kind, tmp_path):
    """At temperature 0 the walk over the calibration tables drafts and accepts exactly what the loop does, for
    every draft kind and draft length: the prediction's only error is in what it cannot see (other prompts)."""
    engine = make_engine(kind, tmp_path)
    answers = advise.calibrate(engine, {"d": engine.drafter}, PROMPTS, params=SamplingParams(), k_max=3,
                               max_tokens=12)["d"]
    drafted = 0
    for k in (1, 2, 3):
        predicted = advise.walks(answers, k, UNIT_COSTS, 12, greedy=True)
        for row, walk in zip(PROMPTS, predicted, strict=True):
            stats = engine.generate(row["prompt"], max_tokens=12, draft_max=k).stats
            assert (walk.drafted, walk.accepted) == (stats.drafted, stats.accepted), (k, row)
            drafted += stats.drafted
    assert drafted > 20


def test_walk_at_constant_acceptance_is_the_closed_form():
    """Acceptance alpha at every depth: tokens per round is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al.)."""
    alpha, k, n = 0.7, 3, 60_000
    beta = np.full((n, k), alpha)
    w = advise.walk(beta, k, UNIT_COSTS, n + 10, np.random.default_rng(0))
    rounds = w.seconds  # one second per round
    assert w.tokens / rounds == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha), rel=0.01)
    assert w.accepted / w.drafted == pytest.approx((alpha - alpha ** (k + 1)) / (1 - alpha) / k, rel=0.01)


def test_speed_ratio_draft_length_and_advice_follow_the_costs():
    beta = np.ones((40, 4))
    beta[::5] = 0.0  # every fifth position the draft is wrong at depth 1
    answers = [advise.Answer("x", beta, beta, {})]
    free = advise.predict(answers, UNIT_COSTS, k_max=4, max_tokens=40, greedy=True)
    # a pass costs the same whatever its length: the ratio is tokens per round; the longest draft wins
    assert free["draft_lengths"][1]["speedup"] == pytest.approx(40 / 24, abs=1e-3)  # 8 misses, 16 hits (2 tokens each)
    assert free["best_draft_length"] == 4
    costly = advise.Costs({n: float(n) for n in range(1, 6)}, 0.0, 1.0, 0.0, "a draft token costs a pass")
    paid = advise.predict(answers, costly, k_max=4, max_tokens=40, greedy=True)
    assert paid["best_draft_length"] == 0 and paid["best_speedup"] == 1.0
    drafts = {"cheap": {"categories": {"x": free, "overall": free}},
              "dear": {"categories": {"x": paid, "overall": paid}}}
    advice = advise.recommend(drafts)
    assert advice["x"]["draft"] == "cheap" and advice["x"]["draft_length"] == 4
    assert advise.recommend({"dear": drafts["dear"]})["x"]["draft"] is None


class Clock:
    """Seconds that pass only in a model's passes (the loop's `clock`): every time the loop takes is exact."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedFake(FakeBackend):
    """A fake whose pass costs `per_pass` plus `per_token` for each token fed, on `clock`."""

    def __init__(self, table, clock, *, per_pass=0.0, per_token=0.0):
        super().__init__(table)
        self.clock, self.per_pass, self.per_token = clock, per_pass, per_token

    def forward(self, tokens, n_logits, *, copy=True):  # always a new array
        self.clock.now += self.per_pass + self.per_token * len(tokens)
        return super().forward(tokens, n_logits)


def test_costs_scale_to_what_the_loop_spends(monkeypatch):
    """Components timed alone (here: given wrong on purpose, a draft token at 1/1024 s and a target pass at 1 s)
    are scaled to what real answers spend on them. On a clock that moves only in passes (a draft token 1/256 s, a
    target pass 1/64 s; binary fractions, so every sum is exact), target passes cost what they took, target-only
    decoding is what its answers took, the loop's own work is nothing, and a drafted token costs one draft token
    or, where the draft first reads the target's token and its own last draft (a round after one that kept
    every draft, or a 1-token round), two."""
    import edgespec.api
    from edgespec.decode.loop import speculate

    clock = Clock()
    monkeypatch.setattr(edgespec.api, "speculate", functools.partial(speculate, clock=clock))
    target = TimedFake(table(0), clock, per_pass=1 / 64)
    draft = TimedFake(table(0) + table(1), clock, per_token=1 / 256)
    engine = Engine(target, ModelDrafter(draft, target.vocab), controller())
    wrong = advise.Costs({n: 1.0 for n in range(1, 5)}, 0.0, 1 / 1024, 0.0, "given")
    costs = advise.in_loop(engine, engine.drafter, wrong, [p["prompt"] for p in PROMPTS], SamplingParams(), 3, 12)
    assert costs.target == {n: 1 / 64 for n in range(1, 5)} and costs.row == 0.0
    assert 1 / 256 <= costs.draft_per_token <= 2 / 256 and costs.draft_fixed == 0.0
    assert costs.plain == 1 / 64 and costs.overhead == 0.0
    assert costs.target_only == costs.plain and costs.round(0, 0) == costs.plain


def test_statistics_are_the_distances_they_name():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(7), size=4), rng.dirichlet(np.ones(7), size=4)
    guess = np.array([q[0].argmax(), q[1].argmax(), -1, q[3].argmax()])
    s = advise.depth1_stats(p, q, guess, advise.overlap(p, q), np.zeros(4))
    for i in (0, 1, 3):
        assert s["tv"][i] == pytest.approx(0.5 * np.abs(p[i] - q[i]).sum())
        assert s["accept"][i] == pytest.approx(1 - s["tv"][i])
        assert s["kl_target_draft"][i] == pytest.approx(stats.entropy(p[i], q[i]))
        assert s["kl_draft_target"][i] == pytest.approx(stats.entropy(q[i], p[i]))
        assert s["entropy_draft"][i] == pytest.approx(stats.entropy(q[i]))
    assert np.isnan(s["tv"][2]) and np.isnan(s["top1"][2])  # no draft there
    one_hot = advise.depth1_stats(p, None, guess, p[np.arange(4), np.maximum(guess, 0)], np.zeros(4))
    assert one_hot["tv"][0] == pytest.approx(1 - p[0, guess[0]]) and np.isnan(one_hot["kl_target_draft"][0])


def test_calibration_bins_measure_how_often_the_draft_is_right():
    answers = [advise.Answer("x", np.zeros((4, 1)), np.zeros((4, 1)),
                             {**{name: np.full(4, 0.5) for name in advise.STATS},
                              "confidence": np.array([0.95, 0.95, 0.15, 0.15]), "top1": np.array([1.0, 0, 0, 0])})]
    s = advise.statistics(answers)
    assert [b["top1_agreement"] for b in s["calibration"]] == [0.0, 0.5]
    assert s["calibration_error"] == pytest.approx(0.5 * 0.15 + 0.5 * 0.45)


def test_check_compares_at_the_recommended_length():
    prediction = {"best_draft_length": 3, "draft_lengths": {
        k: {"acceptance": 0.6, "acceptance_interval": [0.5, 0.7], "speedup": 1.0 + k / 10,
            "speedup_interval": [1.0, 1.5]} for k in (1, 2, 3)}}
    measured = {"draft_lengths": {k: {"acceptance": a, "acceptance_interval": [a - 0.1, a + 0.1], "speedup": v}
                                  for k, a, v in [(1, 0.5, 1.3), (2, 0.5, 1.1), (3, 0.55, 1.15)]}}
    c = advise.compare(prediction, measured)
    assert c["acceptance_error"] == pytest.approx(0.05) and c["best_measured_draft_length"] == 1
    assert c["recommended_measured_speedup"] == 1.15 and not c["within_10_percent"]  # 1.15 < 0.9 * 1.3


def test_measured_interval_pools_prompts():
    same = advise.pooled_interval([(10, 5)] * 8)
    assert same == [0.5, 0.5]  # identical prompts: no doubt
    lo, hi = advise.pooled_interval([(10, 1), (10, 9)] * 4)
    assert lo < 0.5 < hi and hi - lo > 0.2


def test_prompts_alternate_so_every_template_lands_on_both_sides():
    """A category written in blocks of one template each: calibration and held-out prompts both see every block,
    none is used twice, and the counts are capped per category."""
    rows = [{"cat": cat, "prompt": f"{cat} template {t} #{i}"} for cat in ("rag", "code") for t in range(3)
            for i in range(4)]
    calibration, held_out = advise.split_alternate(rows, 5, 6)
    for cat in ("rag", "code"):
        cal = [r["prompt"] for r in calibration if r["cat"] == cat]
        held = [r["prompt"] for r in held_out if r["cat"] == cat]
        assert len(cal) == 5 and len(held) == 6 and not set(cal) & set(held)
        assert {p.split()[2] for p in held} == {"0", "1", "2"} and {p.split()[2] for p in cal} == {"0", "1", "2"}
    everything = advise.split_alternate(rows)
    assert len(everything[0]) == len(everything[1]) == 12


@pytest.mark.parametrize("args, message", [(["--draft", "none"], "give a draft"),
                                           (["--also", "ngram"], "each draft once"),
                                           (["--check", "--prompts", "{one}"], "no prompt to hold out")])
def test_advise_refuses_bad_input(args, message, tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import main

    one = tmp_path / "one.jsonl"
    one.write_text('{"cat": "chat", "prompt": "Hi"}\n')
    result = CliRunner().invoke(main, ["advise", *[a.format(one=one) for a in args]])
    assert result.exit_code == 1 and message in result.output, result.output


def test_the_target_answers_through_the_loop_with_its_rows_and_its_end_token():
    """Calibration's answers come from the loop: the tokens, the end token that ended the answer last (which the
    loop's events do not carry), and the target's row at each of them, read back in a teacher-forced pass."""
    from edgespec.plan.calibration import target_answer

    table = np.full((5, 5), -9.0)
    for token, following in {1: 2, 2: 3, 3: 0, 0: 4, 4: 4}.items():  # 1 -> 2 -> 3 -> end (0)
        table[token, following] = 9.0
    backend = FakeBackend(table)
    greedy, rng = SamplingParams(temperature=0), np.random.default_rng(0)
    tokens, rows, hidden = target_answer(backend, [4, 1], greedy, rng, 10)
    assert tokens == [2, 3, 0] and hidden is None
    np.testing.assert_array_equal(rows, table[[1, 2, 3]])
    tokens, rows, _ = target_answer(backend, [4, 1], greedy, rng, 1)  # cut by max_tokens: no end token
    assert tokens == [2] and rows.shape == (1, 5)
    assert backend.tokens == []  # the cache is left empty, as calibration expects
