"""Keys of earlier versions: one method's `algo` fields are entries of `algo.terms` / `algo.shaping` now.

An old spelling still loads, gives the same objective and shapers as the new one, and says its new
spelling once; an old run's config.yaml (every field written out) still resumes."""
from __future__ import annotations

import pytest
import yaml

from lmrl.algos.shapers import active_shapers
from lmrl.algos.terms import active_terms
from lmrl.config import ConfigError
from lmrl.loading import build_config, load_config, load_run_config
from lmrl.recipe_files import migrate_keys


def test_old_keys_become_list_entries_with_a_note_each():
    tree = {"algo": {"demo_nll_coef": 0.1, "overlong_buffer": 4, "overlong_factor": 0.5, "cost_aware_fraction": 0.0,
                     "extra_shapers": [{"name": "reward_clip"}]}}
    notes = migrate_keys(tree)
    assert tree == {"algo": {"terms": [{"name": "demo_nll", "coef": 0.1}],
                             "shaping": [{"name": "overlong", "params": {"buffer": 4, "factor": 0.5}},
                                         {"name": "reward_clip"}]}}
    assert notes == ["algo.demo_nll_coef is spelled algo.terms: [{name: demo_nll, coef: 0.1}] now (docs/migration.md)",
                     "algo.overlong_buffer is spelled algo.shaping: [{name: overlong, params: {buffer: 4, factor: 0.5}}]"
                     " now (docs/migration.md)",
                     "algo.extra_shapers is spelled algo.shaping now (docs/migration.md)"]
    assert migrate_keys(tree) == [] and tree["algo"]["terms"] == [{"name": "demo_nll", "coef": 0.1}]  # idempotent


def test_an_old_key_beside_the_list_sets_its_entry_and_zero_switches_it_off():
    tree = {"algo": {"terms": [{"name": "demo_nll", "coef": 0.1}, {"name": "mine"}], "demo_nll_coef": 0.3}}
    migrate_keys(tree)
    assert tree["algo"]["terms"] == [{"name": "demo_nll", "coef": 0.3}, {"name": "mine"}]
    tree["algo"]["demo_nll_coef"] = 0.0
    migrate_keys(tree)
    assert tree["algo"]["terms"] == [{"name": "mine"}]
    kept = {"algo": {"terms": []}}  # a list the user set stays set (the preset's does not fill it)
    assert migrate_keys(kept) == [] and kept == {"algo": {"terms": []}}


def test_old_and_new_spellings_give_the_same_objective_and_shapers():
    old = load_config("quickstart", ["algo.preset=sgt", "algo.demo_nll_coef=0.2", "algo.overlong_buffer=8",
                                     "algo.cost_aware_fraction=0.5", "algo.kl_coef=0.01"])
    new = load_config("quickstart", ["algo.preset=sgt", "algo.terms=[{name: demo_nll, coef: 0.2}]",
                                     "algo.shaping=[{name: overlong, params: {buffer: 8}}, "
                                     "{name: cost_aware, params: {fraction: 0.5}}]", "algo.kl_coef=0.01"])
    assert active_terms(old.algo) == active_terms(new.algo)
    assert [(s.name, s.knobs) for s in active_shapers(old.algo)] == [
        ("overlong", {"buffer": 8, "factor": 1.0}), ("cost_aware", {"fraction": 0.5})]
    assert [(s.name, s.knobs) for s in active_shapers(new.algo)] == [
        ("overlong", {"buffer": 8}), ("cost_aware", {"fraction": 0.5})]
    assert len(old.notes) == 3 and all("now (docs/migration.md)" in n for n in old.notes)
    assert new.notes == ()


def test_a_preset_list_entry_is_changed_by_name_and_a_replaced_one_is_said():
    cfg = load_config("quickstart", ["algo.preset=sgt", "algo.terms.demo_nll.coef=0.3"])
    assert [(t.name, t.coef) for t in cfg.algo.terms] == [("demo_nll", 0.3)] and cfg.notes == ()
    cfg = load_config("quickstart", ["algo.preset=cost_aware_grpo", "algo.shaping=[{name: overlong, params: {buffer: 4}}]"])
    assert [s.name for s in cfg.algo.shaping] == ["overlong"]
    assert cfg.notes[0].startswith("algo.shaping: replaced the preset cost_aware_grpo's list [cost_aware{fraction: 0.5}]")


def test_an_old_run_config_with_every_field_written_still_resumes(tmp_path):
    tree = build_config({"recipe": "sgt", "algo": {"preset": "sgt"}, "data": {"demonstrations": "rescue"},
                         "task": {"demonstration": "Answer: {answer}"}}).model_dump(mode="json")
    algo = tree["algo"]
    del algo["terms"], algo["shaping"]
    algo.update(demo_nll_coef=0.1, overlong_buffer=0, overlong_factor=1.0, cost_aware_fraction=0.0, extra_terms=[],
                extra_shapers=[])  # as earlier versions wrote it
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
    cfg = load_run_config(tmp_path, ["trainer.steps=30"])
    assert [(t.name, t.coef) for t in cfg.algo.terms] == [("demo_nll", 0.1)] and cfg.algo.shaping == []


def test_a_shaper_checks_its_knobs_against_the_run():
    with pytest.raises(ConfigError, match=r"algo.shaping\[0\] \(overlong\): buffer=40 must be smaller than "
                                          r"rollout.max_new_tokens=40"):
        load_config("quickstart", ["algo.shaping=[{name: overlong, params: {buffer: 40}}]"])


def test_the_old_distill_section_becomes_a_distill_entry_with_its_settings():
    cfg = load_config("quickstart", ["algo.distill={coef: 0.2, context: hindsight_critique, tokens: tool_calls, "
                                     "estimator: k3, params: {judge: {model: m}}}"])
    [term] = [t for t in active_terms(cfg.algo) if t.name == "distill"]
    assert (term.coef, term.knobs) == (0.2, {"estimator": "k3"})
    assert term.settings == {"context": "hindsight_critique", "context_params": {"judge": {"model": "m"}},
                             "tokens": "tool_calls"}
    assert load_config("quickstart", ["algo.distill={coef: 0.0, tokens: all}"]).algo.terms == []


@pytest.mark.parametrize("preset, old, name", [("sgt", "algo.demo_nll_coef=0", "demo_nll"),
                                               ("cost_aware_grpo", "algo.cost_aware_fraction=0", "cost_aware")])
def test_an_old_key_set_to_zero_switches_the_preset_entry_off(preset, old, name):
    args = ["data.demonstrations=rescue", "task.demonstration=x"] if preset == "sgt" else []
    cfg = load_config("quickstart", [f"algo.preset={preset}", *args, old])
    assert name not in [t.name for t in cfg.algo.terms] + [s.name for s in cfg.algo.shaping]


def test_old_extra_lists_add_to_the_preset_entries():
    cfg = load_config("quickstart", ["algo.preset=cost_aware_grpo",
                                     "algo.extra_shapers=[{name: overlong, params: {buffer: 4}}]"])
    assert [s.name for s in cfg.algo.shaping] == ["cost_aware", "overlong"]


def test_a_term_listed_twice_is_refused():
    with pytest.raises(ConfigError, match=r"algo.terms\[1\].name: the 'demo_nll' term is listed twice"):
        load_config("quickstart", ["algo.terms=[{name: demo_nll, coef: 0.1}, {name: demo_nll, coef: 0.2}]",
                                   "data.demonstrations=rescue", "task.demonstration=x"])


def test_a_preset_entry_is_changed_by_name_wherever_the_preset_is_set():
    cfg = load_config("quickstart", ["algo.terms.demo_nll.coef=0.3", "algo.preset=sgt"])
    assert [(t.name, t.coef) for t in cfg.algo.terms] == [("demo_nll", 0.3)]
