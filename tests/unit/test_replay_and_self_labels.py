"""Recorded rollouts and self-generated labels: REGEN's loss and replay file, CoAct's self-consistency split,
SEIF's instructor and follower rewards; the spec's hand cases and the config checks."""
from __future__ import annotations

import json
import math

import pytest
import torch

from lmrl.algos import AGGREGATIONS, LOSSES, AggScale, LossInputs
from lmrl.config import ConfigError
from lmrl.data import SAMPLE_SOURCES
from lmrl.data.replay import rollout_records
from lmrl.loading import build_config
from lmrl.loops.run_dir import RunDir
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_FNS
from lmrl.rewards.coact import coact_route
from lmrl.rewards.seif import conflicts, follower_rows, parse_instruction
from lmrl.types import Group, Origin, Sample


def one_token(logp: float, mu: float, adv: float) -> LossInputs:
    t = lambda v: torch.tensor([[v]], dtype=torch.float)  # noqa: E731
    return LossInputs(logp=t(logp), old_logp=t(logp), advantages=t(adv), mask=t(1.0), extras={"rollout_logp": t(mu)})


# --- REGEN ---------------------------------------------------------------------------------------


def test_regen_spec_cases():
    regen = LOSSES.get("regen")
    loss, metrics = regen(one_token(-11.0, -10.0, -1.0))  # negative: ρ = min(1, e^-1)
    assert loss.item() == pytest.approx(-math.exp(-1) * 11, abs=1e-5)
    assert loss.item() == pytest.approx(-4.05, abs=5e-3)
    assert metrics["regen/negative_weight"] == pytest.approx(0.368, abs=1e-3)
    assert metrics["regen/negative_frac"] == 1.0
    loss, metrics = regen(one_token(-10.0, -30.0, 1.0))  # positive: ρ = 1, whatever π/μ
    assert loss.item() == pytest.approx(10.0)
    assert metrics["regen/ratio_mean"] == pytest.approx(10.0)  # π/μ = e^20, capped at 10
    assert "regen/negative_weight" not in metrics


def test_regen_ratio_is_per_sequence_capped_and_detached():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]], requires_grad=True)
    mu = torch.tensor([[-2.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[-1.0] * 3, [-2.0] * 3])
    x = LossInputs(logp=logp, old_logp=logp.detach(), advantages=adv, mask=mask, extras={"rollout_logp": mu})
    loss, metrics = LOSSES.get("regen")(x, regen_alpha=2.0)
    # row 0: π/μ = e^1 → min(2, e) = 2; row 1: π/μ = e^-1.5
    rho = torch.tensor([2.0, math.exp(-1.5)])
    total = AGGREGATIONS.get("seq_mean_token_sum")(loss, mask, AggScale.of(mask))
    assert total.item() == pytest.approx(float((-adv[:, 0] * rho * (logp.detach() * mask).sum(1)).mean()), rel=1e-5)
    total.backward()
    assert torch.allclose(logp.grad, (-adv * rho.unsqueeze(1)) * mask / 2)  # ρ carries no gradient
    assert metrics["regen/capped_frac"] == 0.5
    normed, _ = LOSSES.get("regen")(x, regen_length_normalize=True)
    # normalised: row 0's mean log-ratio 0.5 → ρ = min(1, e^0.5) = 1; row 1's −0.5 → e^−0.5; ℓ_t ÷ length
    assert normed[0, 0].item() == pytest.approx(-0.5)
    assert normed[1, 0].item() == pytest.approx(-2 * math.exp(-0.5) / 3, rel=1e-5)


def test_regen_config_takes_its_aggregation_and_knobs():
    tree = {"algo": {"loss": "regen", "aggregation": "seq_mean_token_sum", "loss_params": {"regen_alpha": 0.5}}}
    assert build_config(tree).algo.loss == "regen"
    with pytest.raises(ConfigError, match="seq_mean_token_sum"):
        build_config({"algo": {"loss": "regen"}})  # the grpo preset's token_mean is not taken silently


def sample(text: str, row: dict, reward: float = 1.0, prompt=(1, 2)) -> Sample:
    return Sample(list(prompt), [5, 6], [-0.5, -0.25], policy_version=[3, 3], rewards={"r": reward}, reward=reward,
                  text=text, row=row)


def test_rollout_records_replay_the_scored_samples_with_their_logprobs():
    row = {"uid": "u1", "question": "q", "answer": "7", "prompt_ids": [1, 2], "variants": [], "extra": 1}
    dropped = sample("x", row)
    dropped.excluded = "reward error"
    other_prompt = sample("z", row, 0.0, prompt=(9,))
    g = Group("u1", row, [sample("7", row), dropped, other_prompt])
    (record,) = json.loads(json.dumps(rollout_records(4, [g, Group("u2", row, [dropped])])))
    assert record["uid"] == "u1@4" and record["row_uid"] == "u1" and record["step"] == 4
    assert record["extra"] == 1 and "prompt_ids" not in record and "variants" not in record
    assert record["rollout_prompt_ids"] == [1, 2] and len(record["rollouts"]) == 2
    assert record["rollouts"][1]["prompt_ids"] == [9]
    (out,), metrics = SAMPLE_SOURCES.get("replay")(build_config({"data": {"demonstrations": "replay"}}), None, None)(
        [Group(record["uid"], record, [sample("fresh", record, 0.0)])])
    assert [x.text for x in out.samples] == ["7", "z"]
    assert all(x.origin is Origin.REPLAYED for x in out.samples)
    assert Origin.REPLAYED.brings_logprobs and Origin.REPLAYED.in_advantage and not Origin.REPLAYED.sampled
    first = out.samples[0]
    assert (first.prompt_ids, first.completion_ids, first.behaviour_logprobs) == ([1, 2], [5, 6], [-0.5, -0.25])
    assert (first.reward, first.rewards, first.policy_version) == (1.0, {"r": 1.0}, [3, 3])
    assert out.samples[1].prompt_ids == [9]
    assert metrics == {"replay/samples": 2.0, "replay/reward": 0.5}


def test_rollouts_file_rewinds_with_the_other_logs(tmp_path):
    cfg = build_config({"run": {"save_rollouts": True}})
    row = {"uid": "u", "question": "q", "answer": "7", "prompt_ids": [1, 2]}
    run = RunDir(tmp_path)
    run.log_rollouts(1, [Group("u", row, [sample("7", row)])])
    assert not run.rollouts_file.exists()  # off until the config says so
    run.write_config(cfg)
    run.log_rollouts(1, [Group("u", row, [sample("7", row)])])
    saved = run.positions()
    run.log_rollouts(2, [Group("u", row, [sample("7", row)])])
    RunDir(tmp_path).rewind(saved)  # a resumed run logs step 2 again
    assert [json.loads(ln)["step"] for ln in run.rollouts_file.read_text().splitlines()] == [1]
    RunDir(tmp_path, muted=True).log_rollouts(3, [Group("u", row, [sample("7", row)])])
    assert len(run.rollouts_file.read_text().splitlines()) == 1


def test_replay_source_checks_its_knobs():
    with pytest.raises(ConfigError, match="source_params"):
        build_config({"data": {"demonstrations": "replay", "source_params": {"fields": "x"}}})


# --- CoAct ---------------------------------------------------------------------------------------


def votes(answers: list[str], gold: str = "7") -> list[Sample]:
    row = {"answer": gold}
    return [Sample([1], [2], [-0.1], text=f"Answer: {a}", row=row) for a in answers]


def test_coact_spec_cases():
    assert coact_route(7 / 8, 0.75, 0.4) == "self"
    assert coact_route(3 / 8, 0.75, 0.4) == "oracle"
    assert coact_route(5 / 8, 0.75, 0.4) == "skip"
    fn = GROUP_REWARD_FNS.get("coact")
    agree = votes(["3"] * 7 + ["7"])  # 7/8 agree on a wrong answer: self-labelled, gold unread
    assert fn(agree) == [1.0] * 7 + [0.0]
    assert agree[0].info["metrics"] == {"coact/oracle": 0.0, "coact/self_label": 1.0, "coact/agreement": 0.875}
    split = votes(["1", "1", "1", "7", "2", "3", "4", "5"])  # 3/8: the oracle (gold 7) labels it
    assert fn(split) == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert split[0].info["metrics"]["coact/oracle"] == 1.0
    middle = votes(["1"] * 5 + ["2", "3", "4"])  # 5/8: no verdict
    assert fn(middle) == [None] * 8
    assert fn(votes(["1"] * 5 + ["2", "3", "4"]), between="zero") == [0.0] * 8
    with pytest.raises(ValueError, match="tau_lo"):
        fn(votes(["1"] * 8), tau_hi=0.3, tau_lo=0.4)


# --- SEIF ----------------------------------------------------------------------------------------

FOUR = [{"type": "include_keywords", "keywords": ["river"]}, {"type": "max_words", "value": 5},
        {"type": "no_commas"}, {"type": "lowercase"}]


class Evaluator:
    def __init__(self, reply: str):
        self.reply, self.asked = reply, []

    def chat(self, messages, **_):
        self.asked.append(messages[-1]["content"])
        return self.reply


def instructor_text(constraints=FOUR) -> str:
    return "<think>hard</think>" + json.dumps({"instruction": "Describe a river.", "constraints": constraints})


def test_seif_spec_cases():
    cls = REWARD_FNS.get("seif_instructor")
    evaluator = Evaluator("The Nile, a long river in Africa.")  # meets only include_keywords: 1 of 4
    instructor = cls(evaluator=evaluator)
    assert instructor(Sample([1], [2], [0.0], text=instructor_text())) == 0.75
    assert evaluator.asked == ["Describe a river."]
    row = {"constraints": FOUR}
    follower = REWARD_FNS.get("seif_follower")
    reply = "<think>ok</think><answer>a slow river, wide</answer>"  # all but no_commas: 3 of 4
    assert follower(Sample([1], [2], [0.0], text=reply, row=row)) == 0.75
    assert follower(Sample([1], [2], [0.0], text="a slow river", row=row)) == 0.0  # no format


def test_seif_instructor_gets_nothing_for_invalid_instructions():
    instructor = REWARD_FNS.get("seif_instructor")(evaluator=Evaluator(""))
    bad = [instructor_text().replace("include_keywords", "rhyme"), "no json here",
           instructor_text(FOUR + [{"type": "exclude_keywords", "keywords": ["River"]}])]
    for text in bad:
        assert instructor(Sample([1], [2], [0.0], text=text)) == 0.0
    assert instructor(Sample([1], [2], [0.0], text=instructor_text())) == 0.0  # empty answer
    assert conflicts([{"type": "min_words", "value": 9}, {"type": "max_words", "value": 5}])
    assert not conflicts(FOUR)


def test_follower_rows_from_recorded_instructor_rollouts():
    rollouts = [{"text": instructor_text(), "reward": 0.75}, {"text": instructor_text(), "reward": 0.5},
                {"text": "nothing", "reward": 0.0}, {"text": instructor_text([{"type": "lowercase"}]), "reward": 0.0}]
    rows = follower_rows([{"rollouts": rollouts}])
    assert rows == [{"question": "Describe a river.", "answer": "", "constraints": FOUR}]
    assert parse_instruction(rows[0]["question"]) is None
