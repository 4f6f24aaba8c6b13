"""The validation pipeline: ordered stages, every method check derived from declarations, never from names."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lmrl import cli, config
from lmrl.algos import ADVANTAGES, LOSSES
from lmrl.config import ConfigError
from lmrl import validation
from lmrl.loading import build_config
from lmrl.validation import CONFIG_STAGES, PIPELINE, check_row_fields
from lmrl.presets import PRESETS, preset
from lmrl.registry import UserCodeError


def quoted_method_names(path: Path) -> list[tuple[int, str]]:
    """Method names (estimators, losses, presets) written as strings in comparisons or name collections."""
    names = set(ADVANTAGES.names()) | set(LOSSES.names()) | set(PRESETS.names())
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            operands = [node]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        else:
            continue
        found += [(c.lineno, c.value) for operand in operands for c in ast.walk(operand)
                  if isinstance(c, ast.Constant) and c.value in names]
    return found


@pytest.mark.parametrize("module", [config, validation], ids=["config", "validation"])
def test_no_check_names_a_method(module):
    assert quoted_method_names(Path(module.__file__)) == []


def test_pipeline_is_ordered_by_stage_and_load_runs_the_config_stages():
    stages = [stage for stage, _ in PIPELINE]
    assert stages == sorted(stages, key=["names", "combinations", "data"].index)
    assert CONFIG_STAGES == ("names", "combinations")
    checks = [check for _, check in PIPELINE]
    assert len(set(checks)) == len(checks)


def fake_estimator(rewards, groups, mask, **_):
    return rewards


def fake_loss(inputs, **_):
    return inputs


class FakeState:
    knobs = ("fake_window",)


@pytest.fixture
def declare(monkeypatch):
    """Register test-only methods (and presets) with a declaration; the registries are restored afterwards."""
    for registry in (ADVANTAGES, LOSSES, PRESETS):
        for table in ("_items", "_specs", "_docs"):
            monkeypatch.setattr(registry, table, dict(getattr(registry, table)))

    def add(registry, name, **declaration):
        registry.register(name, "test-only", **declaration)(fake_estimator if registry is ADVANTAGES else fake_loss)

    return add


def test_group_relative_estimator_needs_groups(declare):
    declare(ADVANTAGES, "fake_group", group_relative=True)
    declare(ADVANTAGES, "fake_single")
    with pytest.raises(ConfigError, match=r"algo.advantage=fake_group compares samples.*rollout.group_size"):
        build_config({"algo": {"advantage": "fake_group"}, "rollout": {"group_size": 1}})
    build_config({"algo": {"advantage": "fake_single"}, "rollout": {"group_size": 1}})


def test_sequence_ratio_loss_refuses_dual_clip_and_a_presets_bounds_on_token_ratios(declare):
    declare(LOSSES, "fake_seq", sequence_ratio=True)
    preset("fake_seq_preset", "test-only", {"algo.loss": "fake_seq", "algo.eps_low": 3e-4, "algo.eps_high": 4e-4})
    with pytest.raises(ConfigError, match=r"algo.loss=fake_seq is a sequence-level ratio; algo.dual_clip"):
        build_config({"algo": {"loss": "fake_seq", "dual_clip": 3.0}})
    with pytest.raises(ConfigError, match=r"algo.preset=fake_seq_preset brings sequence-ratio clip bounds "
                                          r"\(algo.eps_low=0.0003, algo.eps_high=0.0004\) but algo.loss=ppo_clip"):
        build_config({"algo": {"preset": "fake_seq_preset", "loss": "ppo_clip", "eps_low": 0.2}})
    build_config({"algo": {"preset": "fake_seq_preset", "loss": "ppo_clip", "eps_low": 0.2, "eps_high": 0.2}})
    assert build_config({"algo": {"preset": "fake_seq_preset"}}).algo.eps_low == 3e-4


def test_default_aggregation_is_not_silently_replaced_by_a_presets(declare):
    declare(LOSSES, "fake_agg", default_aggregation="seq_mean_token_mean")
    preset("fake_agg_preset", "test-only", {"algo.loss": "fake_agg", "algo.aggregation": "seq_mean_token_mean"})
    with pytest.raises(ConfigError, match=r"algo.loss=fake_agg is defined with algo.aggregation=seq_mean_token_mean, "
                                          r"but algo.preset=grpo brings algo.aggregation=token_mean; "
                                          r"use algo.preset=fake_agg_preset, or set algo.aggregation yourself"):
        build_config({"algo": {"loss": "fake_agg"}})
    build_config({"algo": {"loss": "fake_agg", "aggregation": "token_mean"}})
    build_config({"algo": {"preset": "fake_agg_preset"}})


def test_peers_need_a_sequence_is_loss(declare):
    declare(LOSSES, "fake_seq_is", sequence_is=True)
    peers = {"data": {"demonstrations": "peers"}, "task": {"peer_rollouts": "peers"}}
    with pytest.raises(ConfigError, match=r"algo.loss=ppo_clip does not use it.*fake_seq_is"):
        build_config(peers)
    build_config({**peers, "algo": {"loss": "fake_seq_is"}})


def test_critic_pairing_and_token_mask_come_from_declarations(declare):
    declare(ADVANTAGES, "fake_critic", critic=True)
    declare(LOSSES, "fake_masking", token_mask=lambda *a, **k: None)
    with pytest.raises(ConfigError, match=r"algo.advantage=fake_critic is critic-based.*algo.critic=false"):
        build_config({"algo": {"advantage": "fake_critic"}})
    with pytest.raises(ConfigError, match=r"algo.critic=true.*never reads; .*fake_critic"):
        build_config({"algo": {"critic": True}})
    build_config({"algo": {"advantage": "fake_critic", "critic": True}})
    with pytest.raises(ConfigError, match="algo.rejected_tokens=keep only applies"):
        build_config({"algo": {"rejected_tokens": "keep"}})
    build_config({"algo": {"loss": "fake_masking", "rejected_tokens": "keep"}})


def test_declared_inputs_must_be_provided_and_state_knobs_are_knobs(declare):
    declare(ADVANTAGES, "fake_needs", requires={"no_such_input"})
    declare(ADVANTAGES, "fake_components", requires={"reward_components"})
    declare(LOSSES, "fake_stateful", state=FakeState)
    with pytest.raises(ConfigError, match=r"algo.advantage=fake_needs needs per-sample inputs \['no_such_input'\]"):
        build_config({"algo": {"advantage": "fake_needs"}})
    with pytest.raises(ConfigError, match=r"fake_components needs .* at least 2 reward components"):
        build_config({"algo": {"advantage": "fake_components"}})
    build_config({"algo": {"advantage": "fake_components"},
                  "reward": {"components": [{"name": "answer"}, {"name": "format"}]}})
    build_config({"algo": {"loss": "fake_stateful", "loss_params": {"fake_window": 3}}})
    with pytest.raises(ConfigError, match=r"algo.loss_params: unknown param 'fake_windw' of policy loss "
                                          r"'fake_stateful'; did you mean 'fake_window'\?"):
        build_config({"algo": {"loss": "fake_stateful", "loss_params": {"fake_windw": 3}}})


def test_data_stage_names_the_method_reading_a_missing_row_field(declare):
    declare(ADVANTAGES, "fake_perm", requires={"perm_index"})
    cfg = build_config({"algo": {"advantage": "fake_perm"}})
    check_row_fields(cfg, [{"perm_index": 0}, {"perm_index": 1}])
    with pytest.raises(ConfigError, match=r"algo.advantage=fake_perm reads the task field 'perm_index', which 1 of 2"):
        check_row_fields(cfg, [{"perm_index": 0}, {}])
    declare(LOSSES, "fake_variants", requires={"prompt_variant"})
    with pytest.raises(ConfigError, match=r"algo.loss=fake_variants reads the row field 'prompt_variant', which only "
                                          r"the rollouts of task.prompt_variants carry.*policy_split preset"):
        check_row_fields(build_config({"algo": {"loss": "fake_variants"}}), [{"question": "q"}])


def test_user_code_names_resolve_at_config_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("def short(sample, **_):\n    return 1.0\n")
    build_config({"reward": {"components": [{"name": "mine.py:short"}], "accuracy_component": "mine.py:short"}})
    with pytest.raises(UserCodeError, match="has no 'shrt'"):
        build_config({"reward": {"components": [{"name": "mine.py:shrt"}], "accuracy_component": "mine.py:shrt"}})


def test_dry_run_refuses_an_impossible_combination_before_any_model_loads(capsys):
    assert cli.main(["train", "algo.kl_in_reward=true", "algo.kl_coef=0", "--dry-run"]) == 2
    assert "algo.kl_in_reward=true needs algo.kl_coef > 0" in capsys.readouterr().err


def test_a_probing_sampler_in_the_asynchronous_loop_is_refused_before_any_model_loads():
    from lmrl.loading import build_config

    with pytest.raises(ConfigError, match="data.sampler=hive probes prompts with the learner's current policy"):
        build_config({"data": {"sampler": "hive"}, "rollout": {"max_staleness": 1}})
    build_config({"data": {"sampler": "hive", "sampler_params": {"entropy_threshold": 0}},
                  "rollout": {"max_staleness": 1}})  # without the entropy stage it does not probe
