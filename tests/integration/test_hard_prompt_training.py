"""Help on hard prompts in the real loop on a tiny random model: KnowRL's hinted re-rolls, TaoSR-AGRL's guided
replay into the group and RISE-RL's privileged rows under the supervised term, a few steps each."""
from __future__ import annotations

import json
import math

import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.loops.batching import to_batch
from lmrl.inputs import provide
from lmrl.loops.collect import batch_inputs, collect_groups
from lmrl.models import tiny_llama
from lmrl.types import Origin


def stages_for(cfg):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def trained(cfg, stages) -> list[dict]:
    rows = train(cfg, stages=stages).run_dir.joinpath("metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, rows) if "reward/mean" in r]
    assert len(steps) == cfg.trainer.steps and all(math.isfinite(r["grad_norm"]) for r in steps)
    return steps


def test_knowrl_hints_roll_failed_prompts_again_with_their_knowledge_points(tmp_path):
    task = tmp_path / "hinted.jsonl"
    task.write_text("".join(json.dumps({"question": f"q{i % 10} say it", "answer": "7",
                                        "hints": ["the answer is 7", "write 7"], "hint_index": [0]}) + "\n"
                            for i in range(64)))
    cfg = toy_run_config(tmp_path, 3, dataset=task, data={"demonstrations": "hints"})
    stages = stages_for(cfg)
    seen, kept, metrics = collect_groups(stages)
    hinted = [g for g in kept if g.uid.endswith("#hint")]
    assert len(hinted) == metrics["hints/groups"] > 0
    assert all(g.row["question"].endswith("## Hint\n1. the answer is 7") and len(g.samples) == 8 for g in hinted)
    assert all(x.origin is Origin.SAMPLED and x.prompt_ids == g.row["prompt_ids"] for g in hinted for x in g.samples)
    assert not {g.uid for g in hinted} & {g.uid for g in seen}  # the hinted rollouts stay out of the rollout metrics
    steps = trained(cfg, stages)
    assert sum(r["hints/groups"] for r in steps) > 0


def test_knowrl_css_chooses_each_rows_points_with_the_policy(tmp_path):
    """The offline search (`python -m lmrl.task_files hints`): every row gets a non-empty subset of its points, the
    rollouts scored by the run's reward; a row without points is left as it is."""
    import torch

    from lmrl.data.hints import choose_hints
    from lmrl.engines import build_engine

    cfg = toy_run_config(tmp_path, 1, data={"demonstrations": "hints"})
    tok = make_tokenizer()
    engine = build_engine(cfg, tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tok)
    rows = [{"uid": "a", "question": "q1 say it", "answer": "7", "hints": ["say 7", "seven", "7"]},
            {"uid": "b", "question": "q2 say it", "answer": "7"}]
    rows = [{**r, "prompt_ids": tok.apply_chat_template([{"role": "user", "content": r["question"]}],
                                                        add_generation_prompt=True)} for r in rows]
    out = choose_hints(cfg, rows, engine, tok, samples=4, delta=0.03, generator=torch.Generator().manual_seed(0))
    chosen = out[0]["hint_index"]
    assert chosen and chosen == sorted(set(chosen)) and set(chosen) <= {0, 1, 2} and "prompt_ids" not in out[0]
    assert "hint_index" not in out[1]


def test_taosr_guided_rollouts_replace_the_worst_members_under_the_original_prompt(tmp_path):
    cfg = toy_run_config(tmp_path, 3, data={"demonstrations": "guided_replay",
                                            "source_params": {"tau": 0.25, "count": 2}})
    stages = stages_for(cfg)
    _, kept, metrics = collect_groups(stages)
    assert metrics["guided/replaced"] > 0
    guided = [(g, x) for g in kept for x in g.samples if x.origin is Origin.GUIDED]
    assert len(guided) == metrics["guided/replaced"] and all(len(g.samples) == 8 for g in kept)
    assert all(x.prompt_ids == g.row["prompt_ids"] and x.info["guided_prompt"].endswith("The correct answer is 7.")
               for g, x in guided)
    inputs = batch_inputs(stages, kept, 1)
    batch = to_batch(inputs, 0)
    assert "in_advantage" not in batch.row_extras  # guided rows join their group's advantage estimate
    provide(batch, inputs, with_learner=True)
    rows = batch.row_extras["demonstration"].nonzero().flatten()
    assert len(rows) == len(guided) and (batch.behaviour_logprobs[rows].sum(1) < 0).all()  # the policy's, re-scored
    steps = trained(cfg, stages)
    assert sum(r["guided/replaced"] for r in steps) > 0


def test_rise_privileged_rows_train_through_the_auxiliary_term(tmp_path):
    cfg = toy_run_config(tmp_path, 3, algo={"demo_nll_coef": 0.1},
                         data={"demonstrations": "privileged",
                               "source_params": {"criteria": {"contains_7": "Write the digit 7."}, "min_misses": 2,
                                                 "count": 4}})
    steps = trained(cfg, stages_for(cfg))
    assert all(r["privileged/active"] == 1.0 for r in steps)
    assert sum(r["privileged/prompts"] for r in steps) > 0
    with_rows = [r for r in steps if r["privileged/kept"] > 0]
    assert with_rows and all(math.isfinite(r["demo_nll"]) for r in with_rows)
    state = torch.load(tmp_path / "runs" / "toy" / "checkpoints" / "step-000003" / "state.pt", weights_only=False)
    saved = state["sample_source"]  # the miss counts and reward history continue on resume
    assert len(saved["history"]) == 3 and saved["misses"] and saved["active"]


TWO_TURN_ENV = '''
from lmrl.envs import Step
from lmrl.envs.single_turn import prompt_messages


class TwoTurns:
    """The row's prompt (examples included), one "again" from the environment, then the episode ends."""

    def reset(self, row, seed):
        return prompt_messages(row, None), {"turn": 0}

    def step(self, reply, state):
        state["turn"] += 1
        done = state["turn"] == 2
        return Step(None if done else [{"role": "user", "content": "again"}], 0.0, done)
'''

EXAMPLE = [{"role": "user", "content": "q0 say it"}, {"role": "assistant", "content": "7"}]


def test_guided_replay_of_episodes_shows_examples_and_trains_them_under_the_plain_prompt(tmp_path):
    """Guided episodes see a worked exchange before the question; moved under the group's own episode prompt
    they keep their environment tokens out of the loss."""
    (tmp_path / "two_turns.py").write_text(TWO_TURN_ENV)
    cfg = toy_run_config(tmp_path, 2, env={"name": f"{tmp_path / 'two_turns.py'}:TwoTurns", "max_turns": 2},
                         reward={"components": [{"name": "contains_7"}, {"name": "env"}],
                                 "accuracy_component": "contains_7"},
                         data={"demonstrations": "guided_replay",
                               "source_params": {"tau": 1.01, "count": 2, "guidance": "", "examples": EXAMPLE}})
    stages = stages_for(cfg)
    _, kept, metrics = collect_groups(stages)
    assert metrics["guided/replaced"] == 2 * len(kept)
    for group in kept:
        plain = [x for x in group.samples if x.origin is Origin.SAMPLED]
        guided = [x for x in group.samples if x.origin is Origin.GUIDED]
        assert len(guided) == 2 and plain
        for x in guided:
            assert x.prompt_ids == plain[0].prompt_ids  # the episode prompt without the example
            assert x.info["messages"][:2] == EXAMPLE  # what the guided episode was shown
            assert x.loss_mask is not None and 0 in x.loss_mask and len(x.loss_mask) == len(x.completion_ids)
        assert EXAMPLE[1]["content"] not in [m["content"] for m in plain[0].info["messages"][:2]]
    steps = trained(cfg, stages)
    assert all(r["guided/replaced"] > 0 for r in steps)


def test_guided_replay_needs_guidance_or_examples(tmp_path):
    import pytest

    from lmrl.config import ConfigError

    with pytest.raises(ConfigError, match="guidance text or examples"):
        toy_run_config(tmp_path, 1, data={"demonstrations": "guided_replay", "source_params": {"guidance": ""}})
    with pytest.raises(ConfigError, match="needs a role"):
        toy_run_config(tmp_path, 1, data={"demonstrations": "guided_replay",
                                          "source_params": {"examples": [{"role": "system", "content": "x"}]}})
    toy_run_config(tmp_path, 1, data={"demonstrations": "guided_replay",  # a tool's result is a message too
                                      "source_params": {"examples": [{"role": "tool", "content": "408"}]}})
