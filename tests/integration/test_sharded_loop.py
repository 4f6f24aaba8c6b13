"""The training loop with the sharded learner (`trainer.sharding: fsdp`) on 2 gloo ranks: it ends with the
weights of a one-process run that samples the same chunks (2 local rollout workers); a run stopped after
its step-2 checkpoint and resumed on 2 ranks, or on 1 process, ends with the uninterrupted run's weights;
`lmrl export` writes the gathered weights as a transformers directory.

One spawn of 2 ranks runs the uninterrupted run (4 steps, checkpoints at 2 and 4), the stopped run (2
steps) and its resume on 2 ranks; this process runs the one-process references."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from conftest import toy_run_config, toy_run_on_disk
from lmrl.cli import main
from lmrl.config import ConfigError
from lmrl.loops import build_stages, train
from lmrl.loops.setup import data_parallel
from lmrl.models.sharded_checkpoint import gather_weights

SHARDED = {"threads": 1, "mini_batches": 2, "sharding": "fsdp"}


def config(tmp_path, name, steps, **sections):
    trainer = {**SHARDED, **sections.pop("trainer", {})}
    disk = toy_run_on_disk(tmp_path)
    disk["model"].update(sections.pop("model", {}))
    return toy_run_config(tmp_path / name, steps, **disk, trainer=trainer, run={"checkpoint_every": 2}, **sections)


def sharded_runs(parallel, full, stopped, resumed, copy_to, asynchronous):
    try:  # what several ranks refuse
        data_parallel(asynchronous)
        refusal = None
    except ConfigError as err:
        refusal = str(err)
    stages = build_stages(full)
    train(full, stages=stages)
    whole = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in stages.model.state_dict().items()}
    run_dir = train(stopped).run_dir
    if parallel.is_main:  # the stopped run as it was, for a resume on one process
        shutil.copytree(run_dir, copy_to)
    parallel.barrier()
    again = build_stages(resumed)
    train(resumed, resume=run_dir, stages=again)
    return whole, refusal, again.learner.optimizer_steps


def weights(run_dir, tmp_path):
    checkpoint = run_dir / "checkpoints" / "step-000004"
    return load_file(str(gather_weights(checkpoint, tmp_path / f"whole-{run_dir.parent.parent.name}")
                         / "model.safetensors"))


def assert_close(a, b):
    assert a.keys() == b.keys()
    for k in a:  # float32; the gradients add up in another order than on one process
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from lmrl.dist import spawn_local

    tmp = tmp_path_factory.mktemp("sharded_loop")
    full, stopped = config(tmp, "full", 4), config(tmp, "stopped", 2)
    resumed = config(tmp, "stopped", 4)
    asynchronous = config(tmp, "async", 1, rollout={"max_staleness": 1})
    return tmp, spawn_local(sharded_runs, 2, full, stopped, resumed, tmp / "copy", asynchronous)[0]


def test_two_sharded_ranks_train_like_one_process(runs):
    tmp, _ = runs
    single = config(tmp, "single", 4, dist={"backend": "local", "rollout_workers": 2}, trainer={"sharding": "none"})
    result = train(single, stages=build_stages(single))
    plain = load_file(str(result.run_dir / "checkpoints" / "step-000004" / "model" / "model.safetensors"))
    assert_close(weights(tmp / "full" / "runs" / "toy", tmp), plain)


def test_a_sharded_run_resumes_on_two_ranks_and_on_one_process(runs):
    tmp, (_, _, resumed_updates) = runs
    uninterrupted = weights(tmp / "full" / "runs" / "toy", tmp)
    assert_close(weights(tmp / "stopped" / "runs" / "toy", tmp), uninterrupted)
    one = config(tmp, "stopped", 4, dist={"backend": "local", "rollout_workers": 2})
    stages = build_stages(one)
    train(one, resume=tmp / "copy", stages=stages)
    assert_close(weights(tmp / "copy", tmp), uninterrupted)
    assert resumed_updates == stages.learner.optimizer_steps == 4  # steps 3 and 4, two mini-batches each


def test_export_and_merge_write_the_gathered_weights(runs):
    tmp, (gathered, _, _) = runs
    assert main(["export", str(tmp / "full" / "runs" / "toy"), "--merge", str(tmp / "exported")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp / "exported")
    exported = model.state_dict()
    assert exported.keys() == gathered.keys()
    for k, v in gathered.items():
        assert torch.equal(exported[k], v), k
    run = str(tmp / "full" / "runs" / "toy")
    assert main(["merge", run, run, "--t", "0.5", "--out", str(tmp / "merged")]) == 0  # reads the shards too
    merged = AutoModelForCausalLM.from_pretrained(tmp / "merged").state_dict()
    assert all(torch.equal(merged[k], v) for k, v in gathered.items())
    initial = load_file(str(tmp / "model" / "model.safetensors"))
    assert max(float((initial[k] - v).abs().max()) for k, v in gathered.items()) > 1e-3  # it trained


def test_sharding_refuses_what_it_does_not_run_with(tmp_path):
    for sections, named in [({"data": {"sampler": "hive"}}, "probes prompts"),
                            ({"trainer": {"sharding": "none", "cpu_offload": True}}, "needs trainer.sharding=fsdp"),
                            ({"trainer": {"cpu_offload": True, "device": "cpu"}}, "needs an accelerator")]:
        cfg = config(tmp_path, "refused", 1, **sections)
        with pytest.raises(ConfigError, match=named):
            build_stages(cfg)


def test_several_sharded_ranks_refuse_the_asynchronous_loop(runs):
    _, (_, refusal, _) = runs
    assert "synchronous loop" in refusal and "rollout.max_staleness" in refusal
