"""`trainer.device`: resolution and its errors; policy, reference, value head and optimiser state on the
device; checkpoints that resume on another device (and another AdamW kernel)."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, ConfigError, TrainerConfig, config_to_yaml
from lmrl.learners import Learner
from lmrl.learners.checkpoint import load_checkpoint, save_checkpoint
from lmrl.loading import load_config, load_run_config
from lmrl.models.checkpoint_dirs import latest_checkpoint
from lmrl.loops import build_stages, train
from lmrl.loops.batching import to_batch
from lmrl.loops.collect import batch_inputs, collect_groups
from lmrl.models import tiny_llama
from lmrl.models.device import resolve_device
from lmrl.models.precision import resolve_bf16
from lmrl.types import Sample, collate

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def stages_for(cfg):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def test_cpu_and_auto_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    want = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == want


def test_auto_picks_cuda_when_there_is_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"trainer.device='cuda:2' but this machine has 2 CUDA device\(s\), "
                                          r"cuda:0..cuda:1"):
        resolve_device("cuda:2")


def test_asking_for_cuda_without_one_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    for setting in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match=rf"trainer.device='{setting}' but CUDA is not available .*"
                                              r"use trainer.device=cpu \(or auto\)"):
            resolve_device(setting)


def test_cuda_without_one_fails_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = toy_run_config(tmp_path, 1, trainer={"device": "cuda"}, model={"path": str(tmp_path / "no-model")})
    with pytest.raises(ConfigError, match="CUDA is not available"):
        build_stages(cfg, tokenizer=make_tokenizer())


@pytest.mark.parametrize("setting", ["tpu", "cuda:x", "gpu", "CPU"])
def test_an_unknown_device_is_a_config_error(setting):
    with pytest.raises(ConfigError, match=r"trainer.device: String should match pattern"):
        load_config("quickstart", [f"trainer.device={setting}"])


def tensors_of(optimizer):
    return [(k, v) for state in optimizer.state.values() for k, v in state.items() if torch.is_tensor(v)]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("device", DEVICES)
def test_everything_lives_on_the_device(tmp_path, device, lora):
    model = {"lora": {"r": 4, "alpha": 8}} if lora else {}
    cfg = toy_run_config(tmp_path, 2, algo={"preset": "ppo", "kl_coef": 0.01},
                         trainer={"device": device, "bf16": "auto"}, model=model)
    s = stages_for(cfg)
    want = resolve_device(device)
    train(cfg, stages=s)
    modules = {"policy": s.model, "value head": s.learner.value_head}
    if not lora:
        modules["reference"] = s.learner.reference
    for name, module in modules.items():
        assert {p.device for p in module.parameters()} == {want}, name
    assert (s.learner.reference is None) == lora
    assert s.learner.bf16 == resolve_bf16("auto", want)
    state = tensors_of(s.learner.optimizer)
    assert state and {v.device for k, v in state if k != "step"} == {want}
    fused = want.type == "cuda"
    groups = s.learner.optimizer.param_groups
    assert all(bool(g.get("fused")) == fused and bool(g.get("foreach")) != fused for g in groups)
    assert {v.device for k, v in state if k == "step"} == {want if fused else torch.device("cpu")}
    assert s.learner.logprobs(_batch_of(s)).device == torch.device("cpu")  # batches and their inputs stay on the CPU


def _batch_of(s):
    _, kept, _ = collect_groups(s)
    return to_batch(batch_inputs(s, kept, 1), s.engine.pad_token_id)


PAIRS = [("cpu", "cpu"), pytest.param("cuda", "cpu", marks=CUDA), pytest.param("cpu", "cuda", marks=CUDA)]


@pytest.mark.parametrize(("first", "then"), PAIRS)
def test_a_run_resumes_on_another_device(tmp_path, first, then):
    whole = toy_run_config(tmp_path / "a", 4, trainer={"device": then})
    uninterrupted = stages_for(whole)
    train(whole, stages=uninterrupted)

    cfg = toy_run_config(tmp_path / "b", 2, trainer={"device": first}, run={"checkpoint_every": 1})
    result = train(cfg, stages=stages_for(cfg))
    resumed_cfg = load_run_config(result.run_dir, [f"trainer.device={then}", "trainer.steps=4"])
    resumed = stages_for(resumed_cfg)
    train(resumed_cfg, resume=result.run_dir, stages=resumed)
    want = resolve_device(then)
    assert {p.device for p in resumed.model.parameters()} == {want}
    assert {v.device for k, v in tensors_of(resumed.learner.optimizer) if k != "step"} == {want}
    if first == then:
        for (name, a), (_, b) in zip(uninterrupted.model.named_parameters(), resumed.model.named_parameters()):
            assert torch.equal(a, b), name


def test_device_and_gradient_checkpointing_may_change_on_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_to_yaml(load_config("quickstart", ["trainer.device=cuda"])))
    cfg = load_run_config(run, ["trainer.device=cpu", "trainer.gradient_checkpointing=true"])
    assert (cfg.trainer.device, cfg.trainer.gradient_checkpointing) == ("cpu", True)


def _one_update(learner, vocab: int):
    g = torch.Generator().manual_seed(0)
    samples = [Sample(prompt_ids=torch.randint(4, vocab, (3,), generator=g).tolist(),
                      completion_ids=torch.randint(4, vocab, (1 + i,), generator=g).tolist(),
                      behaviour_logprobs=[-1.0] * (1 + i), reward=float(i % 2)) for i in range(4)]
    batch = collate(samples, [0, 0, 1, 1], pad_id=0)
    algorithm = Algorithm(AlgoConfig(), max_new_tokens=8)
    algorithm.prepare(batch)
    learner.update(batch, algorithm)


@pytest.mark.parametrize(("saved_kernel", "loaded_kernel"), [("fused", "foreach"), ("foreach", "fused")])
def test_optimizer_state_loads_into_the_other_adamw_kernel(tmp_path, tokenizer, monkeypatch, saved_kernel,
                                                           loaded_kernel):
    """What a GPU run (fused AdamW) resumed on the CPU (foreach) and back does, on the CPU: fused AdamW
    runs there too. The loading optimiser keeps its own kernel; its step counters are where it wants them."""
    learners = {}
    for kernel in (saved_kernel, loaded_kernel):
        monkeypatch.setattr("lmrl.learners.policy._adamw_kernel", lambda params, k=kernel: {k: True})
        model = tiny_llama(len(tokenizer), hidden=32, layers=2, heads=4, seed=0)
        learners[kernel] = Learner(model, TrainerConfig(bf16=False, lr=1e-2))
    saved, loaded = learners[saved_kernel], learners[loaded_kernel]
    _one_update(saved, len(tokenizer))
    save_checkpoint(tmp_path, 1, saved.model, tokenizer, saved.optimizer, saved.scheduler, {"step": 1})
    load_checkpoint(latest_checkpoint(tmp_path), loaded.model, loaded.optimizer, loaded.scheduler)
    group = loaded.optimizer.param_groups[0]
    assert group[loaded_kernel] and not group.get(saved_kernel)
    steps = [v for k, v in tensors_of(loaded.optimizer) if k == "step"]
    assert steps and all(s.dtype == torch.float32 and float(s) == 1.0 for s in steps)
    _one_update(loaded, len(tokenizer))
    _one_update(saved, len(tokenizer))
    for (name, a), (_, b) in zip(saved.model.named_parameters(), loaded.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
