"""Sequence-level distillation files from a tiny random teacher (`python -m lmrl.task_files teacher_samples`): the SFT
source renders each written row's prompt into the very prompt ids the teacher was given, its trained tokens are the
teacher's where the text round-trips, `--min-reward` keeps exactly the completions the reward passes, and the SFT
stage trains on the file."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer, save_tiny_model, toy_run_config
from lmrl.data.sources import sft
from lmrl.data.teacher_samples import BELOW_MIN_REWARD, TRUNCATED, teacher_rows
from lmrl.envs.pieces import build_pieces
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.task_files import main

# the characters of the chat template's roles, the system prompt and the questions: a vocabulary small enough that
# a random model ends its replies (EOS) and writes 7s (the toy reward) often
CHARS = sorted(set("systemuserassistant say7 \n"))
SYSTEM = "a tiny system"
BUDGET = 12


def small_tokenizer():
    return make_tokenizer(CHARS)


def write_task(path, n=24):
    path.write_text("".join(json.dumps({"question": f"say {'7' * (1 + i % 3)}", "answer": "7"}) + "\n"
                            for i in range(n)))
    return path


def config(tmp_path, **sections):
    tmp_path.mkdir(parents=True, exist_ok=True)
    task = {"dataset": str(write_task(tmp_path / "task.jsonl")), "system_prompt": SYSTEM, "num_eval": 2,
            "num_train": 22}
    return toy_run_config(tmp_path, 1, task=task, rollout={"max_new_tokens": BUDGET}, **sections)


class Recording:
    """The engine, with each generate call's params and completions kept."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, n, params, generator=None):
        out = self.engine.generate(prompts, n, params, generator)
        self.calls.append((prompts, params, out))
        return out


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Two teacher completions of each of 6 training rows, unfiltered, with the teacher's own token ids."""
    tmp_path = tmp_path_factory.mktemp("teacher")
    tok = small_tokenizer()
    cfg = config(tmp_path)
    pieces = build_pieces(cfg, tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tok)
    rows, engine = pieces.train_rows[:6], Recording(pieces.engine)
    out = teacher_rows(cfg, rows, engine, tok, samples=2, generator=torch.Generator().manual_seed(1))
    sampled = teacher_ids(rows, engine.calls)
    path = tmp_path / "teacher.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out.rows))
    return cfg, tok, rows, out, sampled, path, engine.calls


def teacher_ids(rows, calls):
    """(uid, sample index) -> the token ids the teacher sampled, from the recorded engine calls in order."""
    completions = [group for _, _, outs in calls for group in outs]
    assert len(completions) == len(rows)
    return {(row["uid"], i): c.token_ids for row, group in zip(rows, completions) for i, c in enumerate(group)}


def test_rows_are_conversational_prompt_completions_of_every_sample(written):
    cfg, tok, rows, out, sampled, _, calls = written
    assert [len(prompts) for prompts, _, _ in calls] == [4, 2]  # rollout.prompts_per_step prompts a call
    assert len(out.rows) == out.sampled == 12 and not out.left_out
    assert out.summary() == "12 of 12 teacher completions"
    by_uid = {r["uid"]: r for r in rows}
    for r in out.rows:
        assert r["prompt"] == [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": by_uid[r["uid"]]["question"]}]
        assert r["completion"] == [{"role": "assistant",
                                    "content": tok.decode(sampled[(r["uid"], r["sample"])], skip_special_tokens=True)}]
        assert r["teacher"] == str(cfg.model.path) and "reward" not in r
    assert {r["finish_reason"] for r in out.rows} == {"stop", "length"}  # both kinds occur at this budget


def test_the_sft_source_gives_the_rollout_prompt_ids_and_the_teachers_tokens(written, tmp_path):
    cfg, tok, rows, out, sampled, path, _ = written
    source_cfg = config(tmp_path, algo={"preset": "sft"}, batches={"source": "sft", "dataset": str(path)})
    data = sft(source_cfg, tok, [], [])
    assert len(data.train) == len(out.rows) and not data.dropped
    prompt_ids = {r["uid"]: r["prompt_ids"] for r in rows}
    round_trips = merged = 0
    for group in data.train:
        x, record = group.samples[0], group.row
        teacher = sampled[(record["uid"], record["sample"])]
        if record["completion"][0]["content"].startswith("\n"):
            # the header's "\n" and the reply's first one are tokenised together ("\n\n" is one piece of this
            # tokenizer, as of many BPE ones): that token is the completion's first, not the prompt's last
            assert x.prompt_ids == prompt_ids[record["uid"]][:-1]
            merged += 1
            continue
        assert x.prompt_ids == prompt_ids[record["uid"]]  # the template renders the messages the rollout saw
        mask = x.loss_mask or [1] * len(x.completion_ids)
        trained = [t for t, m in zip(x.completion_ids, mask) if m]
        stopped = record["finish_reason"] == "stop"
        text = teacher[:-1] if stopped else teacher  # a reply that stopped ends with the teacher's EOS
        assert stopped == (teacher[-1] == tok.eos_token_id)
        if tok(record["completion"][0]["content"], add_special_tokens=False)["input_ids"] == text:
            assert trained == text + [tok.eos_token_id]  # a cut reply gains the template's end of turn
            round_trips += 1
    assert round_trips >= 3 and merged < len(data.train)


def test_min_reward_keeps_the_completions_the_reward_passes(tmp_path):
    tok = small_tokenizer()
    cfg = config(tmp_path)
    pieces = build_pieces(cfg, tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tok)
    engine = Recording(pieces.engine)
    out = teacher_rows(cfg, pieces.train_rows[:4], engine, tok, samples=4, generator=torch.Generator().manual_seed(1),
                       min_reward=1.0, drop_truncated=True)
    texts = [(tok.decode(c.token_ids, skip_special_tokens=True), c.finish_reason)
             for _, _, outs in engine.calls for group in outs for c in group]
    cut = sum(why == "length" for _, why in texts)
    passed = [text for text, why in texts if why == "stop" and "7" in text]
    assert out.sampled == 16 and out.left_out[TRUNCATED] == cut
    assert out.left_out[BELOW_MIN_REWARD] == 16 - cut - len(passed)
    assert [r["completion"][0]["content"] for r in out.rows] == passed and passed
    assert all(r["reward"] == 1.0 and r["finish_reason"] == "stop" for r in out.rows)


def test_greedy_asks_the_engine_for_the_most_likely_tokens(tmp_path):
    tok = small_tokenizer()
    cfg = config(tmp_path)
    pieces = build_pieces(cfg, tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tok)
    engine = Recording(pieces.engine)
    first = teacher_rows(cfg, pieces.train_rows[:2], engine, tok, greedy=True, generator=torch.Generator().manual_seed(1))
    again = teacher_rows(cfg, pieces.train_rows[:2], engine, tok, greedy=True, generator=torch.Generator().manual_seed(2))
    assert all(params.greedy for _, params, _ in engine.calls) and first.rows == again.rows


@pytest.fixture
def recipe(tmp_path):
    """The toy recipe on disk without a model: `--model` names the teacher."""
    path = tmp_path / "toy.yaml"
    path.write_text(json.dumps(config(tmp_path).model_dump(mode="json")))
    return path


def test_the_command_writes_a_file_the_sft_stage_trains_on(tmp_path, recipe, capsys):
    teacher, out = save_tiny_model(tmp_path / "teacher", small_tokenizer()), tmp_path / "teacher.jsonl"
    assert main(["teacher_samples", str(recipe), str(out), "--model", str(teacher), "--rows", "4", "--samples", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and {r["teacher"] for r in rows} == {str(teacher)}
    assert f"8 of 8 teacher completions written to {out}" in capsys.readouterr().out
    cfg = config(tmp_path / "student", algo={"preset": "sft"}, trainer={"steps": 2, "lr": 1e-2, "seed": 1},
                 batches={"source": "sft", "dataset": str(out), "size": 4})
    tok = small_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=3), tokenizer=tok)
    result = train(cfg, stages=stages)
    logged = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "nll" in r]
    assert len(steps) == 2 and len(stages.offline.train) == 8
    assert steps[0]["data/trained_tokens"] > 0 and steps[1]["nll"] < steps[0]["nll"]


@pytest.mark.parametrize("extra, message", [
    (["--greedy", "--samples", "2"], "greedy decoding gives the same completion every time"),
    (["--samples", "0"], "samples must be >= 1"),
    (["--rows", "0"], "--rows must be >= 1"),
    (["env.name=guessing", "reward.components=[{name: env}]", "reward.accuracy_component=env"],
     "teacher samples are for single-turn tasks"),
])
def test_bad_input_is_refused_before_any_model_loads(recipe, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as stopped:
        main(["teacher_samples", str(recipe), str(tmp_path / "out.jsonl"), *extra, "--model", str(tmp_path / "none")])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
