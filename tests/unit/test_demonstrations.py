"""Sample sources: demonstrations added to rollout groups (GFT's group member, SGT's rescue row, PRP's
peer rollouts), their origins, and their supervised term."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tokenizer
from lmrl.algos import Algorithm, LossInputs
from lmrl.algos.aggregation import AggScale
from lmrl.config import AlgoConfig, ConfigError, RewardConfig
from lmrl.data import SAMPLE_SOURCES
from lmrl.data.demonstrations import template_fields
from lmrl.loading import build_config
from lmrl.rewards import RewardScorer
from lmrl.types import Group, Origin, Sample


def group(uid: str, texts: list[str], answer: str = "7") -> Group:
    row = {"uid": uid, "question": "q", "answer": answer, "prompt_ids": [1, 2]}
    samples = [Sample([1, 2], [3], [-1.0], text=t, row=row) for t in texts]
    return Group(uid=uid, row=row, samples=samples)


def scored(groups):
    scorer = RewardScorer(RewardConfig())
    scorer.score(groups)
    return groups, scorer


def source(tok, scorer, **tree):
    """The run's sample source (`data.demonstrations`) of the config `tree`."""
    cfg = build_config(tree)
    return SAMPLE_SOURCES.get(cfg.data.demonstrations)(cfg, tok, scorer)


def test_no_source_adds_nothing():
    tok = make_tokenizer()
    groups, scorer = scored([group("a", ["Answer: 7"])])
    assert source(tok, scorer)(groups) == (groups, {})


def test_group_mode_adds_the_scored_demonstration_to_every_group():
    tok = make_tokenizer()
    groups, scorer = scored([group("a", ["Answer: 7", "Answer: 3"]), group("b", ["Answer: 1", "Answer: 2"])])
    add = source(tok, scorer, data={"demonstrations": "group"}, task={"demonstration": "Answer: {answer}"})
    out, metrics = add(groups)
    assert [len(g.samples) for g in out] == [3, 3] and metrics == {"data/demonstrations": 2.0}
    assert [x.origin for x in out[0].samples] == [Origin.SAMPLED, Origin.SAMPLED, Origin.DEMONSTRATION]
    demo = out[0].samples[-1]
    assert demo.in_advantage and demo.reward == 1.0 and demo.text == "Answer: 7"
    assert demo.completion_ids[-1] == tok.eos_token_id
    assert demo.completion_ids[:-1] == tok("Answer: 7", add_special_tokens=False)["input_ids"]
    assert demo.prompt_ids == [1, 2]


def test_rescue_mode_adds_a_separate_row_only_where_nothing_succeeded():
    tok = make_tokenizer()
    groups, scorer = scored([group("a", ["Answer: 7", "Answer: 3"]), group("b", ["Answer: 1", "Answer: 2"])])
    add = source(tok, scorer, data={"demonstrations": "rescue"}, task={"demonstration": "Answer: {answer}"})
    out, metrics = add(groups)
    assert [g.uid for g in out] == ["a", "b", "b#demo"] and metrics == {"data/demonstrations": 1.0}
    rescue = out[2].samples[0]
    assert len(out[1].samples) == 2 and rescue.origin is Origin.RESCUE and not rescue.in_advantage
    assert rescue.completion_ids[-1] == tok.eos_token_id


def test_template_fields_and_config_checks():
    assert template_fields("{solution} / Answer: {answer}") == {"solution", "answer"}
    with pytest.raises(ConfigError, match="task.demonstration"):
        build_config({"data": {"demonstrations": "rescue"}})
    with pytest.raises(ConfigError, match="data.demonstrations"):
        build_config({"algo": {"demo_nll_coef": 0.1}})


def test_supervised_term_on_demonstration_rows_only():
    algo = Algorithm(AlgoConfig(terms=[{"name": "demo_nll", "coef": 0.5}]), max_new_tokens=4)
    logp = torch.tensor([[-1.0, -3.0], [-2.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    x = LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.zeros(2, 2), mask=mask,
                   extras={"demonstration": torch.tensor([1.0, 0.0])})
    loss, metrics = algo.objective(x, AggScale.of(mask))
    # PG part is 0 (A = 0); the demo row's mean NLL is 2, times 0.5, over 2 sequences
    assert float(loss) == pytest.approx(0.5 * 2.0 / 2) and metrics["demo_nll"] == pytest.approx(2.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.125, -0.125], [0.0, 0.0]]))


def test_demonstration_rows_are_never_inert_under_the_supervised_term():
    from lmrl.types import collate

    samples = [Sample([1], [2, 3], [-1.0, -1.0], reward=0.0) for _ in range(3)]
    batch = collate(samples, [0, 0, 1], pad_id=0)
    batch.row_extras["demonstration"] = torch.tensor([0.0, 0.0, 1.0])
    for coef, expected in ((0.0, [True, True, True]), (0.1, [True, True, False])):
        algo = Algorithm(AlgoConfig(terms=[{"name": "demo_nll", "coef": coef}]), max_new_tokens=4)
        algo.prepare(batch)
        assert algo.inert_rows(batch).tolist() == expected


def test_rescue_rows_stay_out_of_the_advantage_estimate():
    """A failed group (rewards 0, 0) plus its rescue demonstration (reward 1): under GRPO the demo is
    not a group of one with A = r, and it does not move the failed rows; both stay at 0."""
    from lmrl.types import collate

    samples = [Sample([1], [2, 3], [-1.0, -1.0], reward=r) for r in (1.0, 0.0, 0.0, 0.0, 1.0)]
    batch = collate(samples, [0, 0, 1, 1, 2], pad_id=0)
    batch.row_extras["demonstration"] = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    batch.row_extras["in_advantage"] = torch.tensor([True, True, True, True, False])
    for advantage in ("grpo", "dr_grpo", "reinforce_pp_baseline", "rloo"):
        algo = Algorithm(AlgoConfig(advantage=advantage, terms=[{"name": "demo_nll", "coef": 0.1}]), max_new_tokens=4)
        algo.prepare(batch)
        assert batch.advantages[2:].abs().sum() == 0, advantage
        assert batch.advantages[0].abs().sum() > 0, advantage


def test_peers_mode_adds_each_peer_rollout_with_the_writers_log_prob():
    """Mutual RL's PRP: two peer texts join the group, scored by the run's reward; each row's behaviour
    log-probs sum to the peer's sequence log-prob."""
    tok = make_tokenizer()
    groups, scorer = scored([group("a", ["Answer: 7", "Answer: 3"])])
    groups[0].row["peers"] = [{"text": "Answer: 7", "logprob": -4.0}, {"text": "Answer: 12", "logprob": -9.0}]
    add = source(tok, scorer, algo={"preset": "prp"}, task={"peer_rollouts": "peers"})
    out, metrics = add(groups)
    assert metrics == {"data/demonstrations": 2.0} and len(out[0].samples) == 4
    peers = out[0].samples[2:]
    assert [p.reward for p in peers] == [1.0, 0.0]
    assert [p.origin for p in peers] == [Origin.PEER, Origin.PEER]
    assert [sum(p.behaviour_logprobs) for p in peers] == pytest.approx([-4.0, -9.0])
    assert peers[1].completion_ids == tok("Answer: 12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    bad = group("b", ["Answer: 1"])
    bad.row["peers"] = [{"text": "Answer: 7"}]
    with pytest.raises(ValueError, match=r"peers\[0\]"):
        add([bad])


def test_peers_mode_config_checks_name_both_settings():
    with pytest.raises(ConfigError, match="task.peer_rollouts"):
        build_config({"data": {"demonstrations": "peers"}, "algo": {"loss": "ppo_clip_tis_seq"}})
    with pytest.raises(ConfigError, match="algo.loss=ppo_clip .*ppo_clip_tis_seq"):
        build_config({"data": {"demonstrations": "peers"}, "task": {"peer_rollouts": "peers"}})
    with pytest.raises(ConfigError, match="mis_seq_agg"):
        build_config({"data": {"demonstrations": "peers"}, "task": {"peer_rollouts": "peers"},
                      "algo": {"loss": "ppo_clip_mis_seq", "loss_params": {"mis_seq_agg": "mean"}}})
    cfg = build_config({"algo": {"preset": "prp"}})
    assert (cfg.data.demonstrations, cfg.task.peer_rollouts, cfg.algo.loss) == ("peers", "peer_rollouts",
                                                                                "ppo_clip_tis_seq")
