"""The `pared` recipe's reward on the real loop with a tiny random model: the discriminator's weights move
with training, and a resumed run continues them exactly as the uninterrupted run."""
from __future__ import annotations

import numpy as np
import yaml

from conftest import make_tokenizer, save_tiny_model, toy_run_config, train_tiny
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.recipe_files import recipe_tree


def pared_reward(tokenizer_dir) -> dict:
    """The recipe's reward section, with the tiny model's tokenizer and the toy run's token budget."""
    reward = yaml.safe_load(yaml.safe_dump(recipe_tree("pared")["reward"]))
    pared = next(c for c in reward["components"] if c["name"] == "pared")
    pared["params"]["tokenizer"] = str(tokenizer_dir)
    pared["params"]["features"][0]["params"]["max"] = 6  # rollout.max_new_tokens of the toy run
    return reward


def config(tmp_path, steps, tokenizer_dir, **run):
    return toy_run_config(tmp_path, steps, reward=pared_reward(tokenizer_dir),
                          run={"checkpoint_every": 1, **run})


def test_the_recipe_trains_and_its_discriminator_moves(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    rows, stages = train_tiny(config(tmp_path / "run", 2, model_dir))
    assert len(rows) == 2
    state = stages.scorer.state_dict()["pared"]
    assert state["updates"] == 2 * 4  # one update per scored group: 4 prompts a step
    assert len(state["pool"]) >= 4 and not np.allclose(state["w"], 0.0)
    assert state["w"][1] > 0  # the demonstrations end with 'Answer: 7'; the random model's replies do not
    assert "reward/pared" in rows[-1]


def test_a_resumed_run_continues_the_discriminator(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    tok = make_tokenizer()

    def stages_of(cfg):
        return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)

    full_cfg = config(tmp_path / "a", 2, model_dir)
    full = stages_of(full_cfg)
    train(full_cfg, stages=full)
    half = train(config(tmp_path / "b", 1, model_dir), stages=stages_of(config(tmp_path / "b", 1, model_dir)))
    rest_cfg = config(tmp_path / "b", 2, model_dir)
    resumed = stages_of(rest_cfg)
    train(rest_cfg, resume=half.run_dir, stages=resumed)
    a, b = full.scorer.state_dict()["pared"], resumed.scorer.state_dict()["pared"]
    assert b["updates"] == a["updates"] == 8
    assert np.allclose(a["w"], b["w"], atol=1e-9) and a["b"] == b["b"] and a["sampler"] == b["sampler"]
