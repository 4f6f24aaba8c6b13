"""Weight-space merging (specs §2.12): hand-computed linear, SLERP and task arithmetic; `lmrl merge` on tiny models."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import make_tokenizer, toy_run_config
from lmrl import cli
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.models.merging import lerp, merge_state_dicts, slerp, task_arithmetic


def test_linear_midpoint_is_the_specs_case():
    out = lerp(torch.tensor([1.0, 3.0]), torch.tensor([3.0, 5.0]), 0.5)
    assert out.tolist() == [2.0, 4.0]


def test_slerp_of_orthogonal_unit_vectors_at_half_is_their_normalised_sum():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    out = slerp(a, b, 0.5)
    assert torch.allclose(out, (a + b) / math.sqrt(2), atol=1e-7)
    assert out.norm().item() == pytest.approx(1.0)  # a linear midpoint would have norm 0.707
    assert torch.allclose(slerp(a, b, 0.0), a) and torch.allclose(slerp(a, b, 1.0), b)
    third = slerp(a, b, 1 / 3)  # a third of the way round the quarter circle: 30 degrees
    assert torch.allclose(third, torch.tensor([math.cos(math.pi / 6), math.sin(math.pi / 6)]), atol=1e-6)


def test_slerp_falls_back_to_linear_for_parallel_and_zero_vectors():
    a = torch.tensor([1.0, 2.0, 2.0])
    assert torch.allclose(slerp(a, 3 * a, 0.5), 2 * a)  # parallel: sin Ω = 0, linear midpoint
    assert torch.allclose(slerp(a, -a, 0.25), 0.5 * a)  # anti-parallel: linear too
    assert torch.allclose(slerp(torch.zeros(3), a, 0.5), 0.5 * a)


def test_slerp_keeps_the_shape_and_dtype_of_matrices():
    a, b = torch.eye(2, dtype=torch.bfloat16), torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.bfloat16)
    out = slerp(a, b, 0.5)
    assert out.shape == (2, 2) and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), torch.full((2, 2), 1 / math.sqrt(2)), atol=1e-2)


def test_task_arithmetic_adds_scaled_deltas_to_the_base():
    base = torch.tensor([1.0, 1.0])
    first, second = torch.tensor([3.0, 1.0]), torch.tensor([1.0, 5.0])  # deltas [2, 0] and [0, 4]
    assert task_arithmetic(base, [first, second], [0.5, 0.25]).tolist() == [2.0, 2.0]
    assert task_arithmetic(base, [first], [1.0]).tolist() == [3.0, 1.0]  # λ = 1: the tuned model itself


def test_state_dicts_merge_per_tensor_with_weights_and_checks():
    a = {"w": torch.tensor([0.0, 4.0]), "step": torch.tensor([3])}
    b = {"w": torch.tensor([4.0, 0.0]), "step": torch.tensor([3])}
    assert merge_state_dicts([a, b], t=0.25)["w"].tolist() == [1.0, 3.0]
    merged = merge_state_dicts([a, b, b], weights=[2, 1, 1])  # normalised to 0.5, 0.25, 0.25
    assert merged["w"].tolist() == [2.0, 2.0] and merged["step"].tolist() == [3]
    assert merge_state_dicts([a, b])["w"].tolist() == [2.0, 2.0]  # uniform by default
    ta = merge_state_dicts([b], "task_arithmetic", base=a, lambdas=[0.5])
    assert ta["w"].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="slerp needs exactly two models"):
        merge_state_dicts([a, b, b], "slerp")
    with pytest.raises(ValueError, match="a base model goes with task_arithmetic only"):
        merge_state_dicts([a, b], "task_arithmetic")
    with pytest.raises(ValueError, match=r"model 2: w has shape \(3,\)"):
        merge_state_dicts([a, {"w": torch.zeros(3), "step": torch.tensor([3])}])
    with pytest.raises(ValueError, match="step is not floating point and differs"):
        merge_state_dicts([a, {**b, "step": torch.tensor([4])}])


def save_tiny(path, seed):
    tok = make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def params(path):
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_cli_merge_writes_a_loadable_interpolated_model(tmp_path, capsys):
    a, b = save_tiny(tmp_path / "a", 0), save_tiny(tmp_path / "b", 1)
    out = tmp_path / "mid"
    assert cli.main(["merge", str(a), str(b), "--t", "0.25", "--out", str(out)]) == 0
    pa, pb, pm = params(a), params(b), params(out)
    for key in pa:
        assert torch.allclose(pm[key], 0.75 * pa[key] + 0.25 * pb[key], atol=1e-6), key
    assert (out / "tokenizer.json").exists()
    assert cli.main(["merge", str(a), str(b), "--method", "slerp", "--out", str(tmp_path / "s")]) == 0
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.allclose(params(tmp_path / "s")[key], slerp(pa[key], pb[key], 0.5), atol=1e-6)
    assert cli.main(["merge", str(b), "--base", str(a), "--method", "task_arithmetic", "--lambdas", "2",
                     "--out", str(tmp_path / "ta")]) == 0
    assert torch.allclose(params(tmp_path / "ta")[key], 2 * pb[key] - pa[key], atol=1e-5)
    assert cli.main(["merge", str(a), str(b), "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert cli.main(["merge", str(a), str(b), str(b), "--method", "slerp", "--out", str(tmp_path / "x")]) == 2
    assert "slerp needs exactly two models, got 3" in capsys.readouterr().err


def test_a_lora_run_is_merged_into_its_base_before_interpolating(tmp_path):
    base = save_tiny(tmp_path / "base", 0)
    cfg = toy_run_config(tmp_path, 1, model={"path": str(base), "lora": {"r": 4, "alpha": 8}})
    s = build_stages(cfg, tokenizer=make_tokenizer())
    with torch.no_grad():  # adapters away from zero, so the exported model differs from its base
        for name, p in s.model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.05)
    result = train(cfg, stages=s)
    exported = tmp_path / "exported"
    assert cli.main(["export", str(result.run_dir), "--merge", str(exported)]) == 0
    out = tmp_path / "half"
    assert cli.main(["merge", str(base), str(result.run_dir), "--out", str(out)]) == 0
    pb, pe, pm = params(base), params(exported), params(out)
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(pb[key], pe[key])
    assert torch.allclose(pm[key], (pb[key] + pe[key]) / 2, atol=1e-6)
