"""Monte-Carlo step values (`rollout.controller: mc_steps`, estimator `mc_step`, shaper `mc_step_rewards`): value-only
continuations from each step's end, scored by the run's reward, never trained nor counted, turned into
V(s_j) − V(s_{j−1}) on each step's tokens, checked against values computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import make_tokenizer, toy_run_config, train_tiny
from lmrl.algos.mc_step import mc_step, mc_step_rewards, step_advantages
from lmrl.config import Config, ConfigError
from lmrl.engines.base import Completion, SamplingParams
from lmrl.engines.hf import HFEngine
from lmrl.envs import rollout
from lmrl.envs.controllers import build_controller
from lmrl.inputs import InputContext
from lmrl.loops.batching import to_batch
from lmrl.loops.collect import rollout_metrics
from lmrl.models import tiny_llama

TOK = make_tokenizer()
# the group's two completions, 3 steps each: the first has no 7 (reward 0), the second ends in one (reward 1)
OWN = ["ab\ncd\nef", "gh\nij\nk7"]
# the k = 2 continuations of each (completion, step end), in the order they are sampled
CONTINUED = {(0, 3): ["7", "x"], (0, 6): ["x", "y"], (1, 3): ["77", "7"], (1, 6): ["7", "z"]}


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class ScriptedEngine:
    """Samples `OWN` for the prompt and `CONTINUED`'s texts for a prompt + prefix; records each call's size."""

    version = 0

    def __init__(self, prompt: list[int]):
        self.prompt, self.calls, self.taken = prompt, [], {}

    def generate(self, prompts, n, params, generator=None):
        self.calls.append((len(prompts), n))
        out = []
        for p in prompts:
            if p == self.prompt:
                out.append([Completion(ids(t), [-0.1] * len(ids(t)), "stop") for t in OWN[:n]])
                continue
            head = p[len(self.prompt):]
            which = next(i for i, t in enumerate(OWN) if ids(t)[: len(head)] == head)
            taken = self.taken.setdefault((which, len(head)), 0)
            self.taken[(which, len(head))] += 1
            text = CONTINUED[(which, len(head))][taken]
            out.append([Completion(ids(text), [-0.2] * len(ids(text)), "stop")])
        return out


def scripted_groups(k: int = 2):
    prompt = ids("say 7")
    row = {"uid": "u0", "prompt_ids": prompt}
    engine = ScriptedEngine(prompt)
    controller = build_controller("mc_steps", {"k": k}, TOK)
    groups = rollout(engine, TOK, [row], 2, SamplingParams(max_new_tokens=12), controller=controller)
    for g in [*groups, *groups[0].value_groups]:  # the run's reward: 1 for a reply with a 7
        for x in g.samples:
            x.reward = float("7" in x.text)
    return engine, groups


def batch_of(groups):
    return to_batch(InputContext(cfg=Config(), groups=groups, step=0, requested=frozenset({"mc_step_values"}),
                                 tokenizer=TOK), TOK.pad_token_id)


def test_step_advantages_of_a_value_sequence():
    assert step_advantages([0.5, 0.75, 1.0]) == pytest.approx([0.25, 0.25])
    assert step_advantages([1.0, 0.25, 0.0]) == pytest.approx([-0.75, -0.25])
    assert step_advantages([0.5]) == []


def test_value_only_continuations_are_sampled_in_one_call_and_kept_apart():
    engine, (group,) = scripted_groups()
    assert engine.calls == [(1, 2), (8, 1)]  # the group's completions, then n * k * (steps - 1) prefixes at once
    assert [x.info["steps"]["ends"] for x in group.samples] == [[3, 6, 8], [3, 6, 8]]
    assert len(group.samples) == 2 and len(group.value_groups) == 4
    texts = {v.uid: [x.text for x in v.samples] for v in group.value_groups}
    assert texts == {"u0#0@3": ["ab\n7", "ab\nx"], "u0#0@6": ["ab\ncd\nx", "ab\ncd\ny"],
                     "u0#1@3": ["gh\n77", "gh\n7"], "u0#1@6": ["gh\nij\n7", "gh\nij\nz"]}
    for v in group.value_groups:  # exact prefix ids and log-probs, then the continuation's; no loss on any token
        for x in v.samples:
            end = x.info["value_of"]["end"]
            owner = group.samples[int(x.info["value_of"]["key"].split("#")[1])]
            assert x.completion_ids[:end] == owner.completion_ids[:end]
            assert x.behaviour_logprobs == [-0.1] * end + [-0.2] * (len(x.completion_ids) - end)
            assert x.loss_mask == [0] * len(x.completion_ids)


def test_value_only_samples_enter_no_batch_and_no_metric():
    _, groups = scripted_groups()
    batch = batch_of(groups)
    assert batch.completion_mask.shape[0] == 2  # the group's two completions only
    bare = [type(g)(g.uid, g.row, g.samples) for g in groups]  # the same groups without their value-only rollouts
    plain = to_batch(InputContext(cfg=Config(), groups=bare, step=0), TOK.pad_token_id)
    torch.testing.assert_close(batch.completion_mask, plain.completion_mask)
    torch.testing.assert_close(batch.input_ids, plain.input_ids)
    assert rollout_metrics(groups, "x") == rollout_metrics(bare, "x")


def test_advantages_by_hand():
    _, groups = scripted_groups()
    batch = batch_of(groups)
    mask = batch.completion_mask.float()
    rewards = torch.tensor([0.0, 1.0])
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(2), torch.tensor([m.nonzero().max() for m in mask])] = rewards
    adv = mc_step(token_rewards, batch.group_index, mask, batch.extras["mc_step_values"])
    # V(s_0) = mean(0, 1) = 0.5. Completion 0: V(s_1) = mean(1, 0) = 0.5, V(s_2) = 0, V(s_3) = r = 0
    # -> A = 0, -0.5, 0. Completion 1: V(s_1) = mean(1, 1) = 1, V(s_2) = mean(1, 0) = 0.5, V(s_3) = 1 -> 0.5, -0.5, 0.5
    per_step = {0: [0.0, -0.5, 0.0], 1: [0.5, -0.5, 0.5]}
    for row in (0, 1):
        start = int(mask[row].nonzero().min())
        want = [a for a, n in zip(per_step[row], (3, 3, 2)) for _ in range(n)]
        assert adv[row, start: start + 8].tolist() == pytest.approx(want)
        assert adv[row].sum() == pytest.approx(sum(a * n for a, n in zip(per_step[row], (3, 3, 2))))
        assert (adv[row] * (1 - mask[row])).abs().sum() == 0
    scaled = mc_step(token_rewards, batch.group_index, mask, batch.extras["mc_step_values"], normalise=True)
    torch.testing.assert_close(scaled, adv / (math.sqrt(0.5) + 1e-6))  # the group's unbiased std of (0, 1)

    shaped, _ = mc_step_rewards(token_rewards, {"mask": mask, "group_index": batch.group_index,
                                                "mc_step_values": batch.extras["mc_step_values"]})
    for row in (0, 1):  # each step's advantage on its last token, nothing elsewhere
        start = int(mask[row].nonzero().min())
        want = [0.0] * 8
        for end, a in zip((3, 6, 8), per_step[row]):
            want[end - 1] = a
        assert shaped[row, start: start + 8].tolist() == pytest.approx(want)
        assert shaped[row].sum() == pytest.approx(float(rewards[row]) - 0.5)  # r − V(s_0)


def test_a_step_end_without_a_scored_continuation_joins_the_next_step():
    _, groups = scripted_groups()
    for x in groups[0].value_groups[1].samples:  # both continuations of completion 0 from step 2's end fail
        x.excluded, x.reward = "reward error", None
    batch = batch_of(groups)
    mask = batch.completion_mask.float()
    token_rewards = torch.zeros_like(mask)
    token_rewards[1, int(mask[1].nonzero().max())] = 1.0
    adv = mc_step(token_rewards, batch.group_index, mask, batch.extras["mc_step_values"])
    start = int(mask[0].nonzero().min())  # completion 0: A = 0.5 - 0.5 on "ab\n", then r - V(s_1) = -0.5 on the rest
    assert adv[0, start: start + 8].tolist() == pytest.approx([0.0] * 3 + [-0.5] * 5)


def test_without_steps_each_completion_is_one_step():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    values = torch.full((2, 3, 3), math.nan)
    values[..., 0] = mask
    token_rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    adv = mc_step(token_rewards, torch.tensor([0, 0]), mask, values)
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]  # r − group mean, Dr.GRPO's advantage
    with pytest.raises(ValueError, match="mc_step_values"):
        mc_step(token_rewards, torch.tensor([0, 0]), mask)


def test_continuations_from_the_tiny_model_are_exact():
    model = tiny_llama(len(TOK), hidden=32, layers=2, heads=4, seed=0).eval()
    engine = HFEngine(model, [TOK.eos_token_id], TOK.pad_token_id)
    controller = build_controller("mc_steps", {"k": 2, "delimiter": " ", "max_steps": 3}, TOK)
    prompt = ids("say 7")
    out = controller.complete(engine, [prompt], 3, SamplingParams(max_new_tokens=10), torch.Generator().manual_seed(0))
    continued = [v for c in out[0] for vs in c.value_rollouts.values() for v in vs]
    assert len(continued) == 2 * sum(len(c.info["steps"]["ends"]) - 1 for c in out[0]) > 0
    for c in [*out[0], *continued]:
        assert len(c.token_ids) <= 10 and len(c.logprobs) == len(c.token_ids)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1].float(), -1)
        want = logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-5, rtol=1e-5)
    for c in out[0]:
        ends = c.info["steps"]["ends"]
        assert ends[-1] == len(c.token_ids) and len(ends) <= 3
        assert sorted(c.value_rollouts) == [e for e in ends[:-1]] and all(len(v) == 2 for v in c.value_rollouts.values())


def test_the_recipe_settings_train_and_bad_knobs_are_refused(tmp_path):
    cfg = toy_run_config(tmp_path, 2, rollout={"controller": "mc_steps", "group_size": 4, "max_new_tokens": 8,
                                               "controller_params": {"k": 2, "delimiter": " ", "max_steps": 3}},
                         algo={"advantage": "mc_step", "advantage_params": {"normalise": True}})
    rows, _ = train_tiny(cfg)
    assert len(rows) == 2 and all(0 <= r["reward/mean"] <= 1 for r in rows)
    assert rows[0]["value_rollouts/samples"] > 0 and rows[0]["value_rollouts/tokens"] > 0  # logged when sampled
    with pytest.raises(ConfigError, match=r"controller_params of mc_steps: k: Input should be greater than or equal to 1"):
        toy_run_config(tmp_path, 1, rollout={"controller": "mc_steps", "controller_params": {"k": 0}})
    with pytest.raises(ValueError, match="needs the tokenizer"):
        build_controller("mc_steps", {}).complete(None, [[1]], 1, SamplingParams(max_new_tokens=2))
