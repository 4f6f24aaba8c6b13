"""A sample source of the user's own, named as `file.py:name` in `data.demonstrations`, changes the batch of
a tiny model's training run: here it adds one reference completion to each kept group, which the
supervised `demo_nll` term then trains (docs/user_code.md)."""
from __future__ import annotations


import pytest

from conftest import toy_run_config, train_tiny
from lmrl.config import ConfigError

SOURCE = '''
from lmrl.data.demonstrations import SAMPLE_SOURCES, as_members, demonstration_sample


@SAMPLE_SOURCES.register("sevens", "one completion '7' joins each kept group")
def sevens(cfg, tokenizer, scorer):
    def make(row):
        return [demonstration_sample(tokenizer, row, "7", tokenizer.eos_token_id)]
    return lambda groups, generate=None: as_members(groups, make, scorer)
'''


def test_a_source_from_a_file_joins_every_group_and_trains(tmp_path):
    path = tmp_path / "my_source.py"
    path.write_text(SOURCE)
    cfg = toy_run_config(tmp_path, 2, data={"demonstrations": f"{path}:sevens"},
                         algo={"terms": [{"name": "demo_nll", "coef": 0.5}]})
    steps, _ = train_tiny(cfg)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["data/demonstrations"] == 4.0 for r in steps)  # one per kept group, 4 prompts a step
    assert all(r["demo_nll"] > 0 for r in steps)


def test_an_unknown_source_is_refused_with_the_nearest_name(tmp_path):
    with pytest.raises(ConfigError, match="data.demonstrations: unknown sample source 'rescu'; did you mean 'rescue'"):
        toy_run_config(tmp_path, 1, data={"demonstrations": "rescu"})
