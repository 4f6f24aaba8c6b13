"""Math-Shepherd step labels from a tiny random model and the hf engine (`python -m lmrl.task_files steps`):
continuations start from exact token prefixes of the sampled solutions, labels are the means of the graded
outcomes, the file parses as TRL's stepwise-supervision rows, and bad input is refused."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer, save_tiny_model, toy_run_config, write_toy_task
from lmrl.data.step_labels import continue_prefixes, label_steps
from lmrl.engines import SamplingParams
from lmrl.envs import rollout
from lmrl.envs.pieces import build_pieces
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS
from lmrl.task_files import main

# a vocabulary small enough that a random model writes new lines (steps) and 7s (the toy reward) often
CHARS = list("ab7 \n")
BUDGET = 16


def always_fails(sample, **_):
    raise RuntimeError("the grader is down")


if "always_fails" not in REWARD_FNS:
    REWARD_FNS.register("always_fails", "test reward that raises")(always_fails)


def small_tokenizer():
    return make_tokenizer(CHARS, template=None)


def pieces_for(tmp_path, **sections):
    tok = small_tokenizer()
    cfg = toy_run_config(tmp_path, 1, rollout={"max_new_tokens": BUDGET}, **sections)
    return cfg, build_pieces(cfg, tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tok)


class Recording:
    """The engine, with each generate call's prompts, n, params and completions kept."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, n, params, generator=None):
        out = self.engine.generate(prompts, n, params, generator)
        self.calls.append((prompts, n, params, out))
        return out


def seeded(cfg):
    return torch.Generator().manual_seed(cfg.trainer.seed)


def test_continuations_start_from_exact_token_prefixes_of_the_solutions(tmp_path):
    cfg, pieces = pieces_for(tmp_path)
    rows, engine = pieces.train_rows[:3], Recording(pieces.engine)
    out = label_steps(cfg, rows, engine, pieces.tokenizer, solutions=3, k=2, generator=seeded(cfg))
    assert len(out.rows) == 9 and out.no_verdict == 0 and out.left_out == 0
    calls = iter(engine.calls)
    prompts, n, _, solution_sets = next(calls)  # the solutions of prompts_per_step prompts in one call
    assert prompts == [row["prompt_ids"] for row in rows] and n == 3
    prefixes_seen = 0
    for row, solutions in zip(rows, solution_sets):
        written = [r for r in out.rows if r["uid"] == row["uid"]]
        expected, shortest = [], BUDGET
        for r, solution in zip(written, solutions):
            ends = [sum(r["step_tokens"][: j + 1]) for j in range(len(r["step_tokens"]))]
            assert ends[-1] == len(solution.token_ids)
            expected += [row["prompt_ids"] + solution.token_ids[:end] for end in ends[:-1]]
            shortest = min([shortest, *ends[:-1]])
        if expected:
            prompts, n, params, _ = next(calls)
            assert prompts == expected and n == 2 and params.max_new_tokens == BUDGET - shortest
            prefixes_seen += len(expected)
    assert next(calls, None) is None and prefixes_seen >= 2


def test_a_full_reply_is_the_prefix_and_its_continuation_within_the_budget(tmp_path):
    cfg, pieces = pieces_for(tmp_path)
    row, tok, params = pieces.train_rows[0], pieces.tokenizer, SamplingParams(max_new_tokens=BUDGET)
    [group] = rollout(pieces.engine, tok, [row], 4, params, seeded(cfg))
    prefixes = [(i, end) for i, s in enumerate(group.samples) for end in {1, len(s.completion_ids) - 1}
                if 0 < end < len(s.completion_ids)]
    assert len(prefixes) >= 2
    groups = continue_prefixes(pieces.engine, tok, row, group.samples, prefixes, 3, params, seeded(cfg))
    assert len(groups) == len(prefixes)
    for (i, end), g in zip(prefixes, groups):
        assert len(g.samples) == 3
        head = group.samples[i].completion_ids[:end]
        for s in g.samples:
            assert s.prompt_ids == row["prompt_ids"] and len(head) == end
            assert s.completion_ids[:end] == head and len(s.completion_ids) > end
            assert len(s.completion_ids) <= BUDGET and len(s.behaviour_logprobs) == len(s.completion_ids)
            assert s.text == tok.decode(s.completion_ids, skip_special_tokens=True)
            assert s.finish_reason == "stop" or len(s.completion_ids) == BUDGET


def test_labels_are_the_means_of_the_graded_outcomes(tmp_path):
    """The toy reward (a 7 anywhere in the reply) makes outcomes known: a step whose prefix holds a 7 has only
    correct continuations, and the last label is whether the solution has a 7."""
    cfg, pieces = pieces_for(tmp_path)
    rows, tok = pieces.train_rows[:4], pieces.tokenizer
    soft = label_steps(cfg, rows, pieces.engine, tok, solutions=4, k=3, generator=seeded(cfg)).rows
    forced = 0  # steps before the last whose prefix holds a 7
    for r in soft:
        assert len(r["completions"]) == len(r["labels"]) == len(r["outcomes"]) == len(r["step_tokens"])
        assert [len(o) for o in r["outcomes"]] == [3] * (len(r["labels"]) - 1) + [1]
        assert r["labels"] == pytest.approx([sum(o) / len(o) for o in r["outcomes"]])
        assert r["labels"][-1] == float(any("7" in step for step in r["completions"]))
        for j, label in enumerate(r["labels"]):
            if any("7" in step for step in r["completions"][: j + 1]):
                assert label == 1.0
                forced += j < len(r["labels"]) - 1
    assert forced and any(0 < x < 1 for r in soft for x in r["labels"]), "no forced or mixed steps: a weak test"
    again = label_steps(cfg, rows, pieces.engine, tok, solutions=4, k=3, generator=seeded(cfg)).rows
    assert again == soft
    hard = label_steps(cfg, rows, pieces.engine, tok, solutions=4, k=3, hard=True, generator=seeded(cfg)).rows
    assert [r["outcomes"] for r in hard] == [r["outcomes"] for r in soft]
    assert [r["labels"] for r in hard] == [[float(max(o)) for o in r["outcomes"]] for r in soft]


def test_an_answer_the_model_cannot_write_labels_every_step_zero(tmp_path):
    task = tmp_path / "hard.jsonl"
    task.write_text("".join(json.dumps({"question": f"q{i} say it", "answer": "123456"}) + "\n" for i in range(16)))
    cfg, pieces = pieces_for(tmp_path, task={"dataset": str(task), "num_eval": 2, "num_train": 14},
                             reward={"components": [{"name": "answer"}], "accuracy_component": "answer"})
    out = label_steps(cfg, pieces.train_rows[:4], pieces.engine, pieces.tokenizer, solutions=4, k=3,
                      generator=seeded(cfg))
    assert len(out.rows) == 16 and sum(len(r["labels"]) for r in out.rows) > 16
    assert all(x == 0.0 for r in out.rows for o in r["outcomes"] for x in o)
    assert all(x == 0.0 for r in out.rows for x in r["labels"])


def saved_model(path):
    return save_tiny_model(path, small_tokenizer())


@pytest.fixture
def recipe(tmp_path):
    """A toy recipe on disk without a model: `--model` names it."""
    cfg = toy_run_config(tmp_path, 1, dataset=write_toy_task(tmp_path / "toy.jsonl"), rollout={"max_new_tokens": 12})
    path = tmp_path / "toy.yaml"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    return path


def test_the_command_writes_stepwise_rows(tmp_path, recipe, capsys):
    model, out = saved_model(tmp_path / "model"), tmp_path / "steps.jsonl"
    argv = ["steps", str(recipe), str(out), "--model", str(model), "--prompts", "2", "--solutions", "2", "--k", "2",
            "--max-steps", "2"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    task_rows = {r["uid"]: r for r in build_pieces(toy_run_config(tmp_path, 1, dataset=tmp_path / "toy.jsonl"),
                                                   tiny_llama(len(small_tokenizer()), hidden=32, layers=2, heads=4,
                                                              seed=0), small_tokenizer()).train_rows}
    assert len(rows) == 4 and {r["source"] for r in rows} == {str(model)}
    for r in rows:
        assert r["prompt"] == task_rows[r["uid"]]["question"] and r["rendered_prompt"].endswith("\n")
        assert 1 <= len(r["completions"]) == len(r["labels"]) <= 2
        assert all(isinstance(x, float) and 0 <= x <= 1 for x in r["labels"])
        assert not any(step.endswith("\n") for step in r["completions"][:-1])
    steps = sum(len(r["labels"]) for r in rows)
    mean = sum(x for r in rows for x in r["labels"]) / steps
    assert f"4 rows, {steps} steps, mean label {mean:.4f}" in capsys.readouterr().out


def test_a_grader_error_is_shown_and_counted(tmp_path, recipe, capsys):
    model, out = saved_model(tmp_path / "model"), tmp_path / "steps.jsonl"
    argv = ["steps", str(recipe), str(out), "reward.components=[{name: always_fails}]",
            "reward.accuracy_component=always_fails", "--model", str(model), "--prompts", "2", "--solutions", "2",
            "--k", "2"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("reward always_fails failed (error: RuntimeError: the grader is down)") == 1
    assert "0 rows, 0 steps" in captured.out and "4 solutions left out" in captured.out
    assert out.read_text() == ""


@pytest.mark.parametrize("extra, message", [
    (["--k", "0"], "--k and --max-steps must be >= 1"),
    (["--solutions", "0"], "must be >= 1"),
    (["--prompts", "0"], "--prompts, --solutions, --k and --max-steps must be >= 1"),
    (["--max-steps", "0"], "must be >= 1"),
    (["--separator", ""], "--separator must not be empty"),
    (["reward.accuracy_component=format"], "reward.accuracy_component='format' is not one of reward.components"),
    (["env.name=guessing", "reward.components=[{name: env}]", "reward.accuracy_component=env"],
     "step labels are for single-turn tasks"),
])
def test_bad_input_is_refused_before_any_model_loads(recipe, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as stopped:
        main(["steps", str(recipe), str(tmp_path / "out.jsonl"), *extra, "--model", str(tmp_path / "no_model")])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_missing_recipe_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["steps", "no_such_recipe", str(tmp_path / "out.jsonl")])
    assert "no recipe 'no_such_recipe'" in capsys.readouterr().err
