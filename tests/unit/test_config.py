"""Config validation: unknown keys, wrong types, impossible combinations, presets, overrides."""
from pathlib import Path

import pytest

from lmrl.config import RECIPES_DIR, ConfigError, build_config, load_config, parse_override
from lmrl.loops.build import check_names


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match=r"'algo.los'.*did you mean 'algo.loss'"):
        load_config("quickstart", ["algo.los=gspo"])


def test_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match="traner"):
        build_config({"traner": {"lr": 1.0}})


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match="trainer.lr"):
        load_config("quickstart", ["trainer.lr=abc"])


def test_unknown_registry_name_suggests():
    cfg = load_config("quickstart", ["algo.loss=gsp"])
    with pytest.raises(ConfigError, match=r"algo.loss.*did you mean 'gspo'"):
        check_names(cfg)


def test_unknown_reward_component():
    cfg = build_config({"reward": {"components": [{"name": "answr"}], "accuracy_component": "answr"}})
    with pytest.raises(ConfigError, match=r"reward.components\[0\].name.*'answer'"):
        check_names(cfg)


def test_gspo_with_dual_clip_names_both_settings():
    with pytest.raises(ConfigError, match=r"algo.loss=gspo.*algo.dual_clip"):
        load_config("quickstart", ["algo.preset=gspo", "algo.dual_clip=3"])


def test_group_estimator_needs_groups():
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config("quickstart", ["rollout.group_size=1"])


def test_kl_in_reward_needs_coefficient():
    with pytest.raises(ConfigError, match="kl_coef"):
        load_config("quickstart", ["algo.kl_in_reward=true", "algo.kl_coef=0"])


def test_preset_expands_and_user_values_win():
    cfg = load_config("quickstart", ["algo.preset=dapo"])
    assert (cfg.algo.eps_low, cfg.algo.eps_high, cfg.algo.dual_clip) == (0.2, 0.28, 10.0)
    assert cfg.data.group_filter == "nonzero_std"
    cfg = load_config("quickstart", ["algo.preset=dapo", "algo.eps_high=0.3", "data.group_filter=none"])
    assert cfg.algo.eps_high == 0.3 and cfg.data.group_filter == "none"


def test_unknown_preset():
    with pytest.raises(ConfigError, match="did you mean 'dapo'"):
        load_config("quickstart", ["algo.preset=dapoo"])


def test_unknown_recipe_suggests():
    with pytest.raises(ConfigError, match="quickstart"):
        load_config("quickstar")


def test_override_parsing():
    assert parse_override("a.b=2e-6") == ("a.b", 2e-6)
    assert parse_override("a=[1, 2]") == ("a", [1, 2])
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("nonsense")


@pytest.mark.parametrize("recipe", sorted(p.stem for p in Path(RECIPES_DIR).glob("*.yaml")))
def test_every_shipped_recipe_validates(recipe):
    cfg = load_config(recipe)
    check_names(cfg)
    assert cfg.description, f"recipe {recipe} needs a description"


def test_estimator_needing_inputs_the_loop_lacks_fails_at_config_time():
    cfg = load_config("quickstart", ["algo.advantage=rvpo"])
    with pytest.raises(ConfigError, match=r"algo.advantage=rvpo needs per-sample inputs \['components'\]"):
        check_names(cfg)


def test_loss_params_reach_the_loss():
    cfg = load_config("quickstart", ["algo.loss=sapo", "algo.loss_params={sapo_tau_pos: 2.0}"])
    check_names(cfg)
    assert cfg.algo.loss_params == {"sapo_tau_pos": 2.0}
