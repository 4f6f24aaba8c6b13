"""Config validation: unknown keys, wrong types, impossible combinations, presets, overrides."""
import pytest

from lmrl import cli
from lmrl.config import ConfigError
from lmrl.loading import build_config, load_config
from lmrl.recipe_files import parse_override
from lmrl.validation import check_names
from lmrl.presets import PRESETS, Preset


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
    with pytest.raises(ConfigError, match=r"algo.loss.*did you mean 'gspo'"):
        load_config("quickstart", ["algo.loss=gsp"])


def test_unknown_reward_component():
    with pytest.raises(ConfigError, match=r"reward.components\[0\].name.*'answer'"):
        build_config({"reward": {"components": [{"name": "answr"}], "accuracy_component": "answr"}})


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


def test_estimator_needing_inputs_the_loop_lacks_fails_at_config_time():
    with pytest.raises(ConfigError, match=r"algo.advantage=rvpo needs per-sample inputs \['components'\]"):
        load_config("quickstart", ["algo.advantage=rvpo"])


def test_loss_params_reach_the_loss():
    cfg = load_config("quickstart", ["algo.loss=sapo", "algo.loss_params={sapo_tau_pos: 2.0}"])
    check_names(cfg)
    assert cfg.algo.loss_params == {"sapo_tau_pos": 2.0}


def test_presets_are_a_registry_of_described_settings(capsys):
    assert {"grpo", "dapo", "gspo", "ppo", "evpo", "resrl", "gdpo", "rvpo", "entrocraft", "eqlen", "xgrpo", "alpo",
            "prpo", "prp", "policy_split"} <= set(PRESETS)
    for name in PRESETS.names():
        record = PRESETS.get(name)
        assert isinstance(record, Preset) and record.settings and record.description == PRESETS.describe(name)
    assert PRESETS.get("dapo").settings["algo.eps_high"] == 0.28
    with pytest.raises(TypeError):
        PRESETS.get("dapo").settings["algo.eps_high"] = 0.3  # read-only: a run cannot change the table
    assert cli.main(["list", "algos"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in PRESETS.names()) and "DAPO:" in listed


def test_preset_values_are_copied_into_the_config():
    cfg = load_config("quickstart", ["algo.preset=entrocraft"])
    cfg.algo.advantage_params["binary_to_signed"] = False
    assert PRESETS.get("entrocraft").settings["algo.advantage_params"] == {"binary_to_signed": True}


def test_inherited_tells_preset_and_default_values_from_the_users():
    cfg = load_config("quickstart", ["algo.preset=dapo", "algo.eps_high=0.3"])
    assert cfg.inherited("algo.eps_low") and cfg.inherited("algo.horizon")  # the preset's, a field default
    assert not cfg.inherited("algo.eps_high") and not cfg.inherited("trainer.lr")  # override, recipe
