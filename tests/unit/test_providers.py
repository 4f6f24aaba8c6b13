"""Input providers and sample origins: what the batch carries for each origin, which rows get the current
policy's log-probs, the providers' declarations and the inputs they cover."""
from __future__ import annotations

import pytest
import torch

from lmrl.algos import ADVANTAGES, LOSSES
from lmrl.inputs import PROVIDERS, InputContext, ProviderSpec, provide, provided_inputs
from lmrl.loading import build_config
from lmrl.loops.batching import to_batch
from lmrl.types import Group, Origin, Sample


def group(uid: str, table: str, origins: list[Origin], rewards: list[float]) -> Group:
    samples = [Sample([1, 2], [3, 4], [-1.0, -1.0], rewards={"answer": r}, reward=r, origin=o)
               for o, r in zip(origins, rewards)]
    return Group(uid, {"uid": uid, "table": table}, samples)


def context(groups: list[Group], learner=None, **algo) -> InputContext:
    return InputContext(build_config({"algo": algo}), groups, frozenset(), step=1, learner=learner)


class PolicyLogprobs:
    """A learner stand-in whose current policy gives every token log-prob -0.5."""

    def logprobs(self, batch, rows=None):
        return torch.full_like(batch.completion_mask, -0.5)


def test_sampled_rows_only_carry_no_origin_flags():
    batch = to_batch(context([group("a", "t", [Origin.SAMPLED] * 2, [1.0, 0.0])]), 0)
    assert "demonstration" not in batch.row_extras and "in_advantage" not in batch.row_extras


def test_origin_flags_follow_the_origin_of_each_row():
    groups = [group("a", "t", [Origin.SAMPLED, Origin.DEMONSTRATION, Origin.PEER], [0.0, 1.0, 1.0]),
              group("b", "t", [Origin.SAMPLED], [0.0]), group("b#demo", "t", [Origin.RESCUE], [1.0])]
    batch = to_batch(context(groups, group_by="table"), 0)
    assert batch.row_extras["demonstration"].tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert batch.row_extras["demonstration"].dtype == torch.float
    assert batch.row_extras["in_advantage"].tolist() == [True, True, True, True, False]
    assert batch.group_index.tolist() == [0, 0, 0, 0, 1]  # the rescue row is never pooled by group_by


def test_rows_without_behaviour_logprobs_get_the_current_policys():
    """Demonstration and rescue rows come with no log-probs; the engine's and a peer's are kept."""
    origins = [Origin.SAMPLED, Origin.DEMONSTRATION, Origin.RESCUE, Origin.PEER]
    ctx = context([group("a", "t", origins, [0.0, 1.0, 1.0, 1.0])], learner=PolicyLogprobs())
    batch = to_batch(ctx, 0)
    provide(batch, ctx, with_learner=True)
    totals = (batch.behaviour_logprobs * batch.completion_mask).sum(1).tolist()
    assert totals == [-2.0, -1.0, -1.0, -2.0]
    assert [o.brings_logprobs for o in origins] == [True, False, False, True]


def test_a_provider_missing_what_it_needs_says_so():
    ctx = InputContext(build_config({}), [group("a", "t", [Origin.SAMPLED], [1.0])], frozenset())
    with pytest.raises(ValueError, match="'step' needs \\['step'\\]"):
        to_batch(ctx, 0)


def test_declarations_are_checked_and_provides_defaults_to_the_name():
    with pytest.raises(TypeError, match="teacher"):
        ProviderSpec(needs={"teacher"})
    assert PROVIDERS.spec("ref_logp").provides == {"ref_logp"} and "learner" in PROVIDERS.spec("ref_logp").needs
    assert PROVIDERS.in_order().index("rollout_logp") < PROVIDERS.in_order().index("model_outputs")


def test_every_declared_input_has_a_provider():
    """The inputs each registered estimator and loss declares, and the old loop's inputs, are provided."""
    declared = {n for r in (ADVANTAGES, LOSSES) for name in r.names() for n in r.spec(name).requires}
    assert declared <= provided_inputs()
    assert {"acc", "group_acc", "rollout_logp", "ref_logp", "old_logp", "step", "total_steps", "components",
            "reward_components", "entropy", "acoustic_rewards", "speech_mask", "pmi", "values", "hidden",
            "token_entropy", "peer_rewards", "perm_index", "prompt_variant"} <= provided_inputs()
