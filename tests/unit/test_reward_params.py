"""Every component's params are bound to its signature at config time (`registry.check_knobs`), so a
misspelt knob fails `--dry-run` naming the nearest valid one instead of raising on every sample."""
from __future__ import annotations

import pytest

from lmrl import cli
from lmrl.config import ConfigError
from lmrl.loading import build_config
from lmrl.registry import KnobError, check_knobs
from lmrl.rewards import REWARD_FNS
from lmrl.types import Sample

USER_REWARDS = '''
def short_and_right(sample, limit: int = 20):
    return float(sample.info["row"]["answer"] in sample.info["text"] and sample.num_generated < limit)


def needs_a_limit(sample, limit):
    return 0.0


class Remembering:
    def __init__(self, size: int = 3):
        self.size = size

    def __call__(self, sample):
        return 0.0
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards_params.py"
    path.write_text(USER_REWARDS)
    return path


def components(*items: dict) -> dict:
    return {"reward": {"components": list(items), "accuracy_component": items[0]["name"]}}


def test_a_misspelt_param_of_a_user_reward_fails_the_dry_run_with_the_nearest_name(user_file, capsys):
    name = f"{user_file}:short_and_right"
    override = f"reward.components=[{{name: '{name}', params: {{limt: 30}}}}]"
    assert cli.main(["train", override, f"reward.accuracy_component={name}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "reward.components[0].params: unknown param 'limt' of reward function" in err
    assert "short_and_right'; did you mean 'limit'?" in err
    build_config(components({"name": name, "params": {"limit": 30}}))


def test_a_built_in_reward_takes_no_unknown_knob_at_config_time_nor_when_called():
    with pytest.raises(ConfigError, match=r"reward.components\[0\].params: unknown param 'fallbak' of reward "
                                          r"function 'answer'; did you mean 'fallback'\?"):
        build_config(components({"name": "answer", "params": {"fallbak": "last_number"}}))
    sample = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0],
                    text="Answer: 3", row={"answer": "3"})
    assert REWARD_FNS.get("answer")(sample, fallback="last_number") == 1.0
    for name in ("answer", "format", "length", "truncated", "reasoning_gym"):
        with pytest.raises(TypeError, match="fallbak"):
            REWARD_FNS.get(name)(sample, fallbak="last_number")


def test_a_required_param_left_out_and_a_class_reward_bound_through_its_constructor(user_file):
    with pytest.raises(ConfigError, match=r"reward function '.*:needs_a_limit' needs the param\(s\) 'limit'"):
        build_config(components({"name": f"{user_file}:needs_a_limit"}))
    build_config(components({"name": f"{user_file}:needs_a_limit", "params": {"limit": 5}}))
    with pytest.raises(ConfigError, match=r"unknown param 'sise' of reward function '.*:Remembering'; "
                                          r"did you mean 'size'\? \(its params: size\)"):
        build_config(components({"name": f"{user_file}:Remembering", "params": {"sise": 2}}))
    build_config(components({"name": f"{user_file}:Remembering", "params": {"size": 2}}))


@pytest.mark.parametrize("tree, message", [
    (components({"name": "majority_vote", "params": {"min_agreemnt": 0.5}}),
     r"reward.components\[0\].params: unknown param 'min_agreemnt' of group reward function 'majority_vote'; "
     r"did you mean 'min_agreement'\?"),
    (components({"name": "meds", "params": {"coeff": 0.2}}),
     r"unknown param 'coeff' of group reward function 'meds'; did you mean 'coef'\?"),
    ({"reward": {"aggregation": "gated", "aggregation_params": {"gate": {"answer": 0.5}}}},
     r"reward.aggregation_params: unknown param 'gate' of reward aggregation 'gated'; did you mean 'gates'\?"),
    ({"algo": {"loss_params": {"eps_low": 0.1}}},
     r"algo.loss_params: 'eps_low' is passed by the run, not a param of policy loss 'ppo_clip'"),
    ({"algo": {"preset": "ppo", "advantage_params": {"gama": 0.9}}},
     r"algo.advantage_params: unknown param 'gama' of advantage estimator 'gae'; did you mean 'gamma'\?"),
    ({"env": {"name": "tool_use", "params": {"format_rewrd": 0.2}}, **components({"name": "env"})},
     r"env.params: unknown param 'format_rewrd' of environment 'tool_use'; did you mean 'format_reward'\?"),
    ({"algo": {"terms": [{"name": "distill", "coef": 0.1, "params": {"context_params": {"max_char": 10}}}]}},
     r"algo.terms\[0\] \(distill\): context_params: unknown param 'max_char' of teacher context 'hindsight_critique'; "
     r"did you mean 'max_chars'\?"),
    ({"data": {"demonstrations": "hints", "source_params": {"max_acuracy": 0.2}}},
     r"data.source_params: unknown param 'max_acuracy' of data.demonstrations=hints; did you mean 'max_accuracy'\?"),
])
def test_every_registry_that_takes_params_binds_them_the_same_way(tree, message):
    with pytest.raises(ConfigError, match=message):
        build_config(tree)


def test_check_knobs_reads_catch_alls_and_knobs_consumed_elsewhere():
    def ignores(x, a: int = 1, **_):
        return x

    def forwards(x, a: int = 1, **rest):
        return x

    check_knobs(forwards, {"anything": 1}, "forwards", passed=1)  # a named catch-all forwards what it gets
    with pytest.raises(KnobError, match=r"unknown param 'b' of ignores \(its params: a\)"):
        check_knobs(ignores, {"b": 1}, "ignores", passed=1)
    check_knobs(ignores, {"a": 2, "window": 3}, "ignores", passed=1, consumed=("window",))
    with pytest.raises(KnobError, match="'x' is passed by the run"):
        check_knobs(ignores, {"x": 0}, "ignores", passed=1)
