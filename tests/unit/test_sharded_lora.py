"""LoRA under the sharded learner (FSDP2 over 2 gloo ranks): the peft model sharded per decoder layer, only its
adapters in the optimiser, updates as the one-process LoRA learner does over 3 updates with a KL term against the
base (the adapters disabled); the engine's weights inside `gathered()` are the adapted ones; the checkpoint holds the
adapters and their AdamW state alone, resumes on 2 ranks and on 1 process as the uninterrupted run goes on, and
exports the adapters and merged model of the unsharded run.

One spawn of 2 ranks runs the 3 updates (a checkpoint after the first and the third) and a resume on 2 ranks; this
process runs the one-process LoRA learner (its plain checkpoints after the same updates) and the resume on 1
process. Float64, as in test_sharded_learner.py: the ranks' other order of summing gradients stays ~1e-16.
"""
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from conftest import make_tokenizer
from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, LoraConfig, TrainerConfig
from lmrl.dist import Parallel, Sharded, spawn_local
from lmrl.learners import Learner
from lmrl.learners.checkpoint import save_checkpoint
from lmrl.learners.sharded_checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from lmrl.models import tiny_llama
from lmrl.models.lora import ADAPTER_FILE, apply_lora, export_merged
from lmrl.models.sharded_checkpoint import SHARDED, loadable_model
from lmrl.models.weights import inference_weights
from test_data_parallel import TRAINER, VOCAB
from test_sharded_learner import full, update

CASE = dict(sizes=[3, 5, 4], algo=dict(kl_coef=0.5))  # uneven passes; the reference is the base
LORA = LoraConfig(r=4, alpha=8)
PROMPT = torch.tensor([[3, 7, 1, 12, 5]])


def lora_learner(parallel):
    torch.manual_seed(0)  # peft draws the A matrices from the global generator: the same in every process
    model = apply_lora(tiny_llama(VOCAB, hidden=32, layers=2, heads=4, seed=0).to(torch.float64), LORA)
    algo = Algorithm(AlgoConfig(**CASE["algo"]), max_new_tokens=6)
    return Learner(model, TrainerConfig(**TRAINER), needs_reference=True, parallel=parallel), algo


def adapters(learner):
    return {name: full(p).detach().clone() for name, p in learner.model.named_parameters() if p.requires_grad}


def train(learner, algo, seeds, save=None):
    """Updates on the batches of `seeds`, `save(step, state)` after the first and the third; the losses."""
    losses = []
    for seed in seeds:
        losses.append(update(learner, algo, CASE, seed=seed)["loss"])
        if save is not None and seed in (0, 2):
            save(seed + 1, {"step": seed + 1, "shuffle": learner.shuffle.get_state()})
    return losses


def engine_view(learner):
    """What a rollout engine sees: the in-process engine's logits (the peft module, its adapters live), and the
    weights an engine with its own copy is sent (the adapters folded in; shards under FSDP2, gathered here).
    The logits first: under FSDP2 a `state_dict()` hands the modules their shards again."""
    learner.model.eval()
    with torch.no_grad():
        logits = learner.model(input_ids=PROMPT).logits
        return {name: full(w) for name, w in inference_weights(learner.model)}, logits


def sharded_runs(parallel, root, tokenizer):
    sharded = Sharded()
    learner, algo = lora_learner(sharded)
    out = {"all_sharded": all(isinstance(p, DTensor) for p in learner.model.parameters()),
           "optimised": sorted(n for n, p in learner.model.named_parameters()
                               if any(p is q for g in learner.optimizer.param_groups for q in g["params"]))}
    out["losses"] = train(learner, algo, range(3), lambda step, state: save_sharded_checkpoint(
        root / "sharded", step, learner, tokenizer, state, 2, sharded))
    out["adapters"] = adapters(learner)
    with sharded.gathered():
        out["engine"] = engine_view(learner)
    again, algo = lora_learner(sharded)
    again.shuffle.set_state(load_sharded_checkpoint(root / "sharded" / "step-000001", again)["shuffle"])
    out["resumed"] = train(again, algo, [1, 2]), adapters(again)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root, tokenizer = tmp_path_factory.mktemp("sharded_lora"), make_tokenizer()
    tiny_llama(VOCAB, hidden=32, layers=2, heads=4, seed=0).to(torch.float64).save_pretrained(root / "base")
    learner, algo = lora_learner(Parallel())
    losses = train(learner, algo, range(3), lambda step, state: save_checkpoint(
        root / "plain", step, learner.model, tokenizer, learner.optimizer, learner.scheduler, state))
    one = {"losses": losses, "adapters": adapters(learner), "engine": engine_view(learner)}
    return root, one, spawn_local(sharded_runs, 2, root, tokenizer)


def assert_same(adapted, ref):
    assert adapted.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(adapted[name], ref[name], rtol=1e-6, atol=1e-12)


def test_two_sharded_lora_ranks_train_like_one_lora_process(runs):
    _, one, ranks = runs
    for rank in ranks:
        assert rank["losses"] == pytest.approx(one["losses"], rel=1e-6)
        assert_same(rank["adapters"], one["adapters"])
    assert ranks[0]["all_sharded"]  # the frozen base too, in the same units as its adapters
    assert ranks[0]["optimised"] == sorted(one["adapters"]) and len(one["adapters"]) == 2 * 7 * 2  # A and B
    assert all(".lora_" in name for name in one["adapters"])
    assert max(float(w.abs().max()) for n, w in one["adapters"].items() if "lora_B" in n) > 1e-3  # B left zero


def test_generation_inside_gathered_sees_the_adapters(runs):
    _, one, ranks = runs
    (weights, logits), (ref_weights, ref_logits) = ranks[1]["engine"], one["engine"]
    assert weights.keys() == ref_weights.keys() and not any(".lora_" in k for k in weights)
    for name in ref_weights:
        torch.testing.assert_close(weights[name], ref_weights[name], rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-6, atol=1e-10)
    base = tiny_llama(VOCAB, hidden=32, layers=2, heads=4, seed=0).to(torch.float64).state_dict()
    moved = max(float((ref_weights[k] - base[k]).abs().max()) for k in base)
    assert moved > 1e-4  # W + scale·B·A: the adapters are folded in


def test_the_checkpoint_holds_the_adapters_and_their_optimiser_state_only(runs):
    root, one, _ = runs
    checkpoint = root / "sharded" / "step-000003"
    saved = dcp.FileSystemReader(str(checkpoint / SHARDED)).read_metadata().state_dict_metadata
    weights = {k[len("model.policy."):] for k in saved if k.startswith("model.")}
    assert weights == set(one["adapters"])  # no base weight
    moments = {k for k in saved if k.startswith("optim.state.") and k.endswith(".exp_avg")}
    assert {k[len("optim.state.policy."):-len(".exp_avg")] for k in moments} == set(one["adapters"])
    assert loadable_model(checkpoint) == checkpoint / "model"  # peft's adapter files, as an unsharded run's


def test_a_sharded_lora_checkpoint_resumes_on_two_ranks_and_on_one_process(runs):
    root, one, ranks = runs
    losses, resumed = ranks[0]["resumed"]
    assert losses == pytest.approx(one["losses"][1:], rel=1e-6)
    assert_same(resumed, one["adapters"])
    learner, algo = lora_learner(Parallel())
    learner.shuffle.set_state(load_sharded_checkpoint(root / "sharded" / "step-000001", learner)["shuffle"])
    assert train(learner, algo, [1, 2]) == pytest.approx(one["losses"][1:], rel=1e-6)
    assert_same(adapters(learner), one["adapters"])
    with pytest.raises(RuntimeError, match="holds LoRA adapters but the model has none"):
        plain = Learner(tiny_llama(VOCAB, hidden=32, layers=2, heads=4, seed=0), TrainerConfig(**TRAINER))
        load_sharded_checkpoint(root / "sharded" / "step-000001", plain)


def test_the_export_equals_the_unsharded_runs(runs):
    root, _, _ = runs
    sharded, plain = root / "sharded" / "step-000003" / "model", root / "plain" / "step-000003" / "model"
    ours, theirs = load_file(str(sharded / ADAPTER_FILE)), load_file(str(plain / ADAPTER_FILE))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-6, atol=1e-12)
    configs = [json.loads((model / "adapter_config.json").read_text()) for model in (sharded, plain)]
    for config in configs:  # a set, written in the order of the process's string hashes
        config["target_modules"] = sorted(config["target_modules"])
    assert configs[0] == configs[1]
    merged = [AutoModelForCausalLM.from_pretrained(export_merged(model, str(root / "base"), LORA, root / name),
                                                   dtype=torch.float64).state_dict()
              for model, name in [(sharded, "export_sharded"), (plain, "export_plain")]]
    assert merged[0].keys() == merged[1].keys()
    for name in merged[1]:
        torch.testing.assert_close(merged[0][name], merged[1][name], rtol=1e-6, atol=1e-9)
