"""GDPO, RVPO and ALPO against the checks of docs/methods/{gdpo,rvpo,alpo}.md."""
import math

import pytest
import torch

from algo_helpers import run_estimator as run
from algo_helpers import seq
from lmrl.algos.multi_reward import modality_mask
from lmrl.stats import softmin_aggregate


R1R2 = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])


def test_gdpo_spec_value_and_batch_norm():
    raw = seq(run("gdpo", [0] * 4, components=R1R2, batch_norm=False))
    assert raw == pytest.approx([1.732, 0, 0, -1.732], abs=1e-3)
    z = seq(run("gdpo", [0] * 4, components=R1R2))
    assert z == pytest.approx([1.2247, 0, 0, -1.2247], abs=1e-3)


def test_gdpo_weights_and_nan_components():
    w = seq(run("gdpo", [0] * 4, components=R1R2, component_weights=[1.0, 0.0], batch_norm=False))
    assert w == pytest.approx([0.866, 0.866, -0.866, -0.866], abs=1e-3)
    comps = R1R2.clone()
    comps[:, 1] = math.nan
    assert seq(run("gdpo", [0] * 4, components=comps, batch_norm=False)) == pytest.approx(w, abs=1e-6)


def test_rvpo_spec_value():
    adv = seq(run("rvpo", [0] * 4, components=R1R2, tau=1.0))
    assert adv == pytest.approx([0.866, -0.336, -0.336, -0.866], abs=1e-3)


def test_softmin_single_checks():
    assert softmin_aggregate(torch.tensor([1.0, -1.0]), 1.0).item() == pytest.approx(-0.4338, abs=1e-4)
    assert softmin_aggregate(torch.tensor([0.5, 0.5]), 1.0).item() == pytest.approx(0.5, abs=1e-6)
    a = torch.tensor([[1.0, -1.0, 0.5]])
    assert softmin_aggregate(a, 1e3).item() == pytest.approx(a.mean().item(), abs=1e-3)
    assert softmin_aggregate(a, 1e-3).item() == pytest.approx(-1.0, abs=1e-2)
    assert softmin_aggregate(torch.tensor([[math.nan, 0.3], [math.nan, math.nan]]), 1.0).tolist() == \
        pytest.approx([0.3, 0.0])


def test_rvpo_batch_norm_and_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    adv = run("rvpo", [0] * 4, components=R1R2, batch_norm=True, mask=mask)
    assert adv[:, 2].abs().max() == 0
    assert adv[:, 0].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv[:, 0].std().item() == pytest.approx(1.0, abs=1e-3)


def test_alpo_spec_value():
    speech = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    adv = run("alpo", [1, 0], acoustic_rewards=torch.tensor([0.0, 1.0]), speech_mask=speech)
    assert adv[0].tolist() == pytest.approx([0.707, 0.707, -0.707], abs=1e-3)
    assert adv[1].tolist() == pytest.approx([-0.707, 0.707, 0.707], abs=1e-3)
    explicit = run("alpo", [9, 9], acoustic_rewards=torch.tensor([0.0, 1.0]), speech_mask=speech,
                   text_rewards=torch.tensor([1.0, 0.0]))
    assert torch.allclose(explicit, adv)


def test_modality_mask_from_token_ranges():
    assert modality_mask(torch.tensor([[5, 100, 199, 200]]), (100, 200)).tolist() == [[0.0, 1.0, 1.0, 0.0]]
