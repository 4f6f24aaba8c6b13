"""Adding a method touches no loop, config or build file (docs/architecture.md, "Adding a method"): an
advantage estimator that needs a new per-sample input is registered here with the provider of that
input, and a tiny model trains with it."""
from __future__ import annotations

import json

import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.algos import ADVANTAGES
from lmrl.inputs import PROVIDERS
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama

RECEIVED: list[tuple[torch.Tensor, torch.Tensor]] = []  # (length_share, generated tokens) per call


@PROVIDERS.register("length_share", "each completion's length as a share of rollout.max_new_tokens [B]",
                    needs={"samples", "cfg"})
def length_share(batch, ctx):
    budget = ctx.cfg.rollout.max_new_tokens
    batch.row_extras["length_share"] = torch.tensor([x.num_generated / budget for x in ctx.samples])


@ADVANTAGES.register("brief_grpo", "GRPO advantages scaled down for long completions: A_i (1 - β L_i / L_max)",
                     requires={"length_share"}, group_relative=True)
def brief_grpo(token_rewards, group_index, mask, length_share, brevity: float = 0.5, **_):
    RECEIVED.append((length_share.clone(), mask.sum(1)))
    grpo = ADVANTAGES.get("grpo")(token_rewards, group_index, mask)
    return grpo * (1 - brevity * length_share).unsqueeze(1)


def test_a_new_estimator_and_its_input_provider_train_a_tiny_model(tmp_path):
    steps = 3
    cfg = toy_run_config(tmp_path, steps, algo={"advantage": "brief_grpo", "advantage_params": {"brevity": 0.5}})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    before = [p.detach().clone() for p in stages.model.parameters()]
    RECEIVED.clear()
    result = train(cfg, stages=stages)

    assert len(RECEIVED) == steps
    for share, generated in RECEIVED:  # the provider's values reached the estimator, row for row
        assert torch.allclose(share, generated / cfg.rollout.max_new_tokens) and share.max() <= 1.0
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    assert any(r["advantage/abs_mean"] > 0 for r in rows if "advantage/abs_mean" in r)
    assert any(not torch.equal(a, b) for a, b in zip(before, stages.model.parameters()))
