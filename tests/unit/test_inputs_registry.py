"""The one provider registry (lmrl/inputs): every input a registered method reads has exactly one provider
or is a field of the step itself, an input cannot get a second provider, an unknown input fails at config
time with the nearest name, and a provider registered here feeds a training step of a tiny model."""
from __future__ import annotations


import pytest
import torch

from conftest import toy_run_config, train_tiny
from lmrl.algos import ADVANTAGES, LOSSES
from lmrl.algos.shapers import SHAPER_INPUTS, SHAPERS
from lmrl.algos.terms import TERMS
from lmrl.config import ConfigError
from lmrl.inputs import PROVIDERS, provided_inputs
from lmrl.inputs.vocabulary import ALIASES, STEP_FIELDS

PROVIDED: list[torch.Tensor] = []  # what `completion_share` filled, per step
SEEN: list[torch.Tensor] = []  # what `share_penalty` read, per step


def completion_share(batch, ctx):
    share = torch.tensor([x.num_generated / ctx.cfg.rollout.max_new_tokens for x in ctx.samples])
    PROVIDED.append(share)
    batch.extras["completion_share"] = share


def share_penalty(rewards, inputs, coef: float = 0.5):
    SEEN.append(inputs["completion_share"])
    return rewards - coef * inputs["completion_share"], {"share_penalty/mean": float(inputs["completion_share"].mean())}


def ref_gap_typo(inputs, mask):
    return inputs.logp * 0, {}


def turn_typo_grpo(token_rewards, group_index, mask, turn_reward=None, **_):
    return token_rewards


@pytest.fixture
def registered(monkeypatch):
    """This file's provider, shaper, and two methods that read an unknown input; the registries are restored
    afterwards."""
    for registry in (PROVIDERS, SHAPERS, TERMS, ADVANTAGES):
        for table in ("_items", "_specs", "_docs"):
            monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    PROVIDERS.register("completion_share", "each completion's length as a share of rollout.max_new_tokens [B]",
                       needs={"samples", "cfg"})(completion_share)
    SHAPERS.register("share_penalty", "r −= coef · the completion's share of the token budget", stage="rewards",
                     inputs={"completion_share"})(share_penalty)
    TERMS.register("ref_gap_typo", "reads an input no provider fills", inputs={"logp", "ref_lgp"})(ref_gap_typo)
    ADVANTAGES.register("turn_typo_grpo", "requires an input no provider fills",
                        requires={"turn_reward"})(turn_typo_grpo)
    PROVIDED.clear()
    SEEN.clear()


def providers_of(name: str) -> list[str]:
    return [p for p, spec in PROVIDERS.specs().items() if ALIASES.get(name, name) in spec.provides]


def declared_inputs() -> set[str]:
    names = {n for r in (ADVANTAGES, LOSSES) for e in r.names() for n in r.spec(e).requires}
    names |= {n for e in TERMS.names() for n in TERMS.spec(e).inputs}
    return names | {n for e in SHAPERS.names() for n in SHAPERS.spec(e).inputs}


def test_every_declared_input_has_exactly_one_provider_or_is_a_step_field():
    assert {n for n in declared_inputs() if n not in STEP_FIELDS and len(providers_of(n)) != 1} == set()
    assert SHAPER_INPUTS <= STEP_FIELDS  # what shapers read beside the batch's extras
    every = [n for spec in PROVIDERS.specs().values() for n in spec.provides]
    assert len(every) == len(set(every))  # no input has two providers
    assert {"reward_components", "components", "acoustic_rewards", "speech_mask", "entropy", "pmi", "turn_rewards",
            "teacher_logp"} <= provided_inputs()


def test_the_unknown_inputs_of_this_file_are_seen(registered):
    assert {n for n in declared_inputs() - STEP_FIELDS if not providers_of(n)} == {"ref_lgp", "turn_reward"}
    assert providers_of("completion_share") == ["completion_share"]


def test_a_second_provider_of_an_input_is_refused(registered):
    with pytest.raises(ValueError, match=r"would fill \['ref_logp'\], which \['ref_logp'\] already provide"):
        @PROVIDERS.register("another_reference", provides={"ref_logp", "another"}, needs={"learner"})
        def another_reference(batch, ctx):
            batch.extras["ref_logp"] = ctx.learner.logprobs(batch, reference=True)
    assert "another_reference" not in PROVIDERS.names() and providers_of("ref_logp") == ["ref_logp"]


@pytest.mark.parametrize("algo, error", [
    ({"terms": [{"name": "ref_gap_typo", "coef": 0.1}]},
     "algo.terms[0] (ref_gap_typo) reads inputs that no provider fills: 'ref_lgp' (did you mean 'ref_logp'?)"),
    ({"shaping": [{"name": "share_penalty"}], "terms": [{"name": "ref_gap_typo", "coef": 0.1}]},
     "'ref_lgp' (did you mean 'ref_logp'?)"),
    ({"advantage": "turn_typo_grpo"},
     "algo.advantage=turn_typo_grpo needs per-sample inputs ['turn_reward'] that the training loop does not provide "
     "yet ('turn_reward' (did you mean 'turn_rewards'?))"),
])
def test_an_unknown_input_fails_at_config_time_with_the_nearest_name(registered, tmp_path, algo, error):
    with pytest.raises(ConfigError) as err:
        toy_run_config(tmp_path, 1, algo=algo)
    assert error in str(err.value)


def test_a_provider_registered_here_feeds_a_training_step(registered, tmp_path):
    cfg = toy_run_config(tmp_path, 2, algo={"shaping": [{"name": "share_penalty", "params": {"coef": 0.5}}]})
    steps, _ = train_tiny(cfg)
    assert [r["step"] for r in steps] == [1, 2]
    assert len(PROVIDED) == len(SEEN) == 2  # the loop asked for the shaper's input once per step
    assert all(torch.equal(p, s) for p, s in zip(PROVIDED, SEEN))
    assert all(0 < float(p.min()) and float(p.max()) <= 1 for p in PROVIDED)
    assert [r["share_penalty/mean"] for r in steps] == pytest.approx([float(p.mean()) for p in PROVIDED])
