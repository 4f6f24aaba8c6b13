"""Row packing (`trainer.pack_rows`): several rows share a packed row, each attending only within itself with
its positions restarting, so log-probs, scores and gradients are those of unpacked rows, on fewer packed rows."""
import pytest
import torch

from lmrl.config import TrainerConfig
from lmrl.learners import Learner
from lmrl.learners.packing import pack, prompt_units, unit_bins
from lmrl.models import tiny_llama
from lmrl.types import Sample, collate


def batch_of_varied_rows():
    torch.manual_seed(0)
    samples = []
    for i, (p, c) in enumerate([(3, 9), (2, 2), (4, 1), (3, 3), (2, 6), (5, 2)]):
        samples.append(Sample(torch.randint(3, 40, (p,)).tolist(), torch.randint(3, 40, (c,)).tolist(), [0.0] * c,
                              reward=0.0, loss_mask=[1] * c if i % 2 else [1, 0] * (c // 2) + [1] * (c % 2)))
    return collate(samples, list(range(len(samples))), pad_id=0)


def test_bins_fit_within_the_longest_row():
    batch = batch_of_varied_rows()
    units = prompt_units(batch)
    bins = unit_bins(batch, units)
    packed = pack(batch, units, pad_id=0, bins=bins)
    assert len(bins) < len(units) and packed.input_ids.shape[1] == 12  # the longest row: 3 + 9
    assert packed.position_ids[bins.index(next(b for b in bins if len(b) > 1))].tolist().count(0) >= 2


@pytest.mark.parametrize("share_prompt", [True, False])
def test_packed_rows_give_the_unpacked_log_probs_scores_and_gradients(share_prompt):
    batch = batch_of_varied_rows()
    results = []
    for pack_rows in (False, True):
        learner = Learner(tiny_llama(48, hidden=32, layers=2, heads=4, seed=0),
                          TrainerConfig(bf16=False, share_prompt=share_prompt, pack_rows=pack_rows), score_head=True)
        out = learner.forward_logprobs(learner.model, batch, with_entropy=True, outputs={"score"})
        (out["logp"] * batch.completion_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None])
        results.append((out["logp"].detach(), out["entropy"].detach(), out["score"].detach(), grads))
    for unpacked, packed in zip(*results):
        assert torch.allclose(unpacked, packed, atol=1e-5)
