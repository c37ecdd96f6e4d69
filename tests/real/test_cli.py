"""The CLI through click's CliRunner, on the default model."""

import json
from importlib import resources

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.plan.placement import gpu_name


@pytest.fixture
def runner():
    return CliRunner()


def test_version_and_help(runner):
    assert runner.invoke(main, ["--version"]).output.startswith("edgespec, version")
    result = runner.invoke(main, ["-h"])
    assert result.exit_code == 0 and "generate" in result.output and "bench" in result.output


def test_generate_json_reports_text_tokens_and_stats(runner):
    result = runner.invoke(main, ["generate", "Name three colors.", "--json", "-n", "24", "--draft-max", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["text"] and len(data["tokens"]) == data["generated_tokens"] <= 24
    for key in ("acceptance_rate", "mean_accepted_length", "target_passes", "tokens_per_second", "drafted",
                "accepted", "accepted_length_histogram", "draft_time_s", "target_time_s", "finish_reason"):
        assert key in data
    # the target runs where this build's llama.cpp puts it by default (a CPU build: the CPU; a GPU build: what fits
    # on its GPU), and says so
    target, gpu = data["placement"]["target"], gpu_name()
    assert data["placement"]["draft"] is None and (target["runtime"], target["layers"]) == ("llama.cpp", 31)
    if gpu is None:
        assert (target["device"], target["gpu_layers"]) == ("cpu", 0)
    else:
        assert target["device"] == gpu and 0 < target["gpu_layers"] <= 31  # the 98 MB model goes to the GPU


def test_generate_streams_text_and_summary(runner):
    result = runner.invoke(main, ["generate", "Say hello.", "-n", "16"])
    assert result.exit_code == 0
    assert "tok/s" in result.stderr and result.stdout.strip()


def test_generate_greedy_same_text_with_and_without_draft(runner):
    args = ["generate", "Count to five.", "--json", "-n", "30"]
    base = json.loads(runner.invoke(main, [*args, "--draft", "none"]).output)
    spec = json.loads(runner.invoke(main, [*args, "--draft-max", "4"]).output)
    assert base["tokens"] == spec["tokens"]


def test_chat_session_with_commands(runner):
    script = "/help\nWhat is 2 + 2?\n/stats\n/reset\n/stats\n/nope\n/exit\n"
    result = runner.invoke(main, ["chat", "-n", "16"], input=script)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "/reset" in out and '"acceptance_rate"' in out and "(conversation cleared)" in out
    assert "unknown command /nope" in out


def test_chat_ends_on_end_of_input(runner):
    assert runner.invoke(main, ["chat"], input="").exit_code == 0


def test_bench_json_on_a_small_prompt_file(runner, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"cat": "a", "prompt": "Say hi."}\n{"cat": "b", "prompt": "List 1 2 3 1 2 3."}\n')
    result = runner.invoke(main, ["bench", "--prompts", str(prompts), "-n", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["categories"]) == {"a", "b"} and report["overall"]["prompts"] == 2
    assert report["overall"]["identical_outputs"] == 2  # greedy: both modes print the same tokens
    assert report["overall"]["speedup"] > 0


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--target", "/nonexistent/model.gguf"], "model file not found"),
    (["generate", "hi", "--draft", "/nonexistent/draft.gguf"], "model file not found"),
    (["generate", "hi", "--top-p", "0"], "Invalid value"),
    (["generate", "hi", "--draft-max", "99"], "Invalid value"),
    (["bench", "--draft", "none"], "bench compares against a draft"),
    (["generate", "hi", "--draft", "ngram+ngram"], "after 'ngram+' name a draft model"),
    (["generate", "hi", "--draft", "ngram+/nonexistent/draft.gguf"], "model file not found"),
    (["advise", "--draft", "ngram+draft.gguf"], "advise models one kind of draft at a time"),
    (["generate", "hi", "--draft", "ngram+eagle", "--tree-width", "2"], "prompt lookup drafts chains"),
    (["generate", "hi", "--gpu-layers", "half"], "GPU layers must be a number or 'all'"),
    (["generate", "hi", "--cpu", "--gpu-layers", "all"], "--cpu runs every layer on the CPU"),
])
def test_user_errors_print_one_line_and_exit_nonzero(runner, args, message):
    result = runner.invoke(main, args)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (TypeError, ValueError))


def test_bad_prompt_file_is_a_clear_error(runner, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    result = runner.invoke(main, ["bench", "--prompts", str(bad)])
    assert result.exit_code == 1 and "expected a JSON object" in result.output


def test_first_of_each_category_keeps_their_order_and_groups_them():
    from edgespec.bench import first_of_each

    rows = [{"cat": c, "prompt": f"{c}{i}"} for i, c in enumerate("abacbab")]
    assert [r["prompt"] for r in first_of_each(rows, 2)] == ["a0", "a2", "b1", "b4", "c3"]
    assert [r["prompt"] for r in first_of_each(rows, 1)] == ["a0", "b1", "c3"]


def test_non_gguf_target(runner, tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 zip, not gguf")
    result = runner.invoke(main, ["generate", "hi", "--target", str(fake)])
    assert result.exit_code == 1 and "not a GGUF file" in result.output


def test_training_commands_refuse_bad_outputs_before_any_work(runner, tmp_path):
    result = runner.invoke(main, ["distill", "--out", str(tmp_path / "draft.bin")])
    assert result.exit_code == 1 and "give --out a .gguf file name" in result.output
    result = runner.invoke(main, ["distill", "--out", str(tmp_path / "draft.gguf"), "--quant", "q4_k_m",
                                  "--quant-aware"])
    assert result.exit_code == 1 and "--quant-aware trains for q4_0 or q8_0; --quant is q4_k_m" in result.output
    result = runner.invoke(main, ["train-heads", "--out", str(tmp_path / "heads.npz")])
    assert result.exit_code == 1 and "name the medusa heads file *.medusa.npz, e.g. heads.medusa.npz" in result.output
    result = runner.invoke(main, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "h.medusa.npz")])
    assert result.exit_code == 1 and "name the eagle heads file *.eagle.npz, e.g. h.eagle.npz" in result.output
    for command in (["distill", "--out", str(tmp_path / "d.gguf")],
                    ["train-heads", "--out", str(tmp_path / "h.medusa.npz")]):
        result = runner.invoke(main, [*command, "--only-prompts"])
        assert result.exit_code == 1 and "--only-prompts needs --prompts" in result.output
    assert not any(tmp_path.iterdir())  # nothing written


def test_training_commands_answer_the_built_in_prompts_and_yours_or_yours_only(tmp_path):
    from edgespec.cli.train import training_prompts
    from edgespec.train.prompts import read_train_prompts

    mine = tmp_path / "p.jsonl"
    mine.write_text('{"cat": "robot", "prompt": "Turn left."}\n')
    built_in = read_train_prompts()
    assert training_prompts(None, False) == built_in
    assert training_prompts(str(mine), False) == [*built_in, {"cat": "robot", "prompt": "Turn left."}]
    assert training_prompts(str(mine), True) == [{"cat": "robot", "prompt": "Turn left."}]


def test_bench_compares_draft_kinds_side_by_side(runner, tmp_path, q4_0_gguf):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"cat": "a", "prompt": "Count from 1 to 5."}\n')
    # a fixed draft length: whether drafting pays is the controller's call, measured, and not this test's
    result = runner.invoke(main, ["bench", "--prompts", str(prompts), "-n", "16", "--also", str(q4_0_gguf),
                                  "--also", f"ngram+{q4_0_gguf}", "--draft-max", "3", "--json"])
    assert result.exit_code == 0, result.output
    ngram, model, both = json.loads(result.stdout)
    assert ngram["draft"] == "ngram" and model["draft"] == f"model:{q4_0_gguf.name}"
    assert both["draft"] == f"ngram+model:{q4_0_gguf.name}" and model["overall"]["lookup_drafted"] == 0
    for report in (ngram, model, both):
        overall = report["overall"]
        assert overall["identical_outputs"] == 1
        # judged drafts are a subset of the drafted ones, the accepted among both
        assert overall["token_acceptance"] >= overall["acceptance_rate"]
        # what a drafted token costs is timed, so only reported here; its arithmetic is checked on a clock below
        assert isinstance(overall["draft_step_cost"], float) and overall["draft_step_cost"] >= 0
    text = runner.invoke(main, ["bench", "--prompts", str(prompts), "-n", "8", "--also", "none"])
    assert text.exit_code == 1 and "compares against a draft" in text.output


def test_draft_step_cost_is_draft_time_per_paid_token_over_a_target_pass(monkeypatch):
    """bench's draft_step_cost on fakes and a clock that moves only in passes (a target pass 1 s, a draft pass
    1/4 s): a draft model at a fixed length makes one pass per token it drafts (its first reads the tokens it
    lags by), so 0.25 exactly; prompt lookup makes none, so 0; the outputs match target-only's either way."""
    import functools

    from fake import FakeBackend, controller, deterministic_table

    import edgespec.api
    from edgespec.api import Engine
    from edgespec.bench import run_bench
    from edgespec.decode.loop import speculate
    from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter
    from edgespec.plan.bound import chain_speedup

    now = [0.0]

    class Timed(FakeBackend):
        def __init__(self, table, seconds):
            super().__init__(table)
            self.seconds = seconds

        def forward(self, tokens, n_logits, *, copy=True):
            now[0] += self.seconds
            return super().forward(tokens, n_logits)

    monkeypatch.setattr(edgespec.api, "speculate", functools.partial(speculate, clock=lambda: now[0]))
    n_vocab, chain = 5, {1: 2, 2: 3, 3: 4, 4: 1}  # the target cycles b c d e; the draft is wrong after d
    prompts = [{"cat": "a", "prompt": "bc"}, {"cat": "b", "prompt": "ebcd"}]
    reports = {}
    for name in ("model", "ngram"):
        target = Timed(deterministic_table(chain, n_vocab), 1.0)
        drafter = (ModelDrafter(Timed(deterministic_table({**chain, 3: 1}, n_vocab), 0.25), target.vocab)
                   if name == "model" else PromptLookupDrafter(n_vocab))
        reports[name] = run_bench(Engine(target, drafter, controller()), prompts, max_tokens=16, draft_max=3)
    for name, cost in (("model", 0.25), ("ngram", 0.0)):
        overall = reports[name]["overall"]
        assert overall["identical_outputs"] == 2 and overall["draft_length_histogram"].get("3", 0) > 0, name
        assert overall["draft_step_cost"] == cost, name
        assert all(c["draft_step_cost"] == cost for c in reports[name]["categories"].values()), name
    assert 0 < reports["model"]["overall"]["acceptance_rate"] < 1  # rejected drafts cost their pass too
    # the chain bound beside the measured speedup: Leviathan's formula on the engine's costs and the judged acceptance
    overall, bound = reports["model"]["overall"], reports["model"]["overall"]["chain_bound"]
    assert bound["alpha"] == overall["token_acceptance"] and bound["draft_step_s"] > 0
    assert 1 <= bound["k"] <= 8 and bound["speedup"] == round(chain_speedup(
        {int(n): r for n, r in bound["pass_cost_ratios"].items()}, bound["draft_start_s"], bound["draft_step_s"],
        bound["alpha"], bound["k"]), 3) and overall["of_bound"] == round(overall["speedup"] / bound["speedup"], 3)


def test_json_schema_constrains_generate_and_bench(runner, tmp_path, q4_0_gguf):
    schema = str(resources.files("edgespec").joinpath("data/robot.schema.json"))
    result = runner.invoke(main, ["generate", "Return a JSON command for: turn left.", "--json-schema", schema,
                                  "-n", "48", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(json.loads(result.output)["text"])["action"] in ("move", "turn", "pick", "place", "stop")
    reports = []
    for extra in ([], ["--grammar-unaware"]):
        result = runner.invoke(main, ["bench", "--draft", str(q4_0_gguf), "--category", "robot", "--json-schema",
                                      schema, "-n", "32", "--draft-max", "3", "--json", *extra])
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout))
    aware, unaware = reports
    assert unaware["draft"].endswith("(grammar-unaware)") and aware["json_schema"]
    assert aware["overall"]["identical_outputs"] == unaware["overall"]["identical_outputs"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = runner.invoke(main, ["generate", "hi", "--json-schema", str(bad)])
    assert result.exit_code == 1 and "cannot read the JSON schema" in result.output
    result = runner.invoke(main, ["bench", "--category", "nope"])
    assert result.exit_code == 1 and "no prompts in the categories nope" in result.output


def test_a_draft_of_another_tokenizer_says_so_and_keeps_the_greedy_text(runner, retokenized_q4_0_gguf):
    args = ["generate", "Count to five.", "--json", "-n", "24"]
    base = json.loads(runner.invoke(main, [*args, "--draft", "none"]).output)
    result = runner.invoke(main, [*args, "--draft", str(retokenized_q4_0_gguf), "--draft-max", "4"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)
    draft = spec["placement"]["draft"]
    assert spec["tokens"] == base["tokens"] and spec["drafted"] > 0
    assert draft["vocabulary"] == "cross-tokenizer" and 0 < draft["shared_tokens"] <= 49152 - 2000
    assert 0 < draft["intersection_mass"] <= 1 and "another tokenizer" in result.stderr
