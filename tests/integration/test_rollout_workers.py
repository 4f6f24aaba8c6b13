"""Rollout workers (`dist:`): Ray actors give the same run as in-process workers, and a worker killed
mid-step is restarted, its prompts re-run, and the run ends as if nothing happened."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config, toy_run_on_disk
from lmrl.engines.workers import WorkerPool, split_evenly
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama

ray = pytest.importorskip("ray", reason="the ray extra is installed by .ci/run")


def stages_for(cfg):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def run(tmp_path, backend, staleness=1, steps=3, hook=None):
    cfg = toy_run_config(tmp_path / backend, steps, rollout={"max_staleness": staleness},
                         dist={"backend": backend, "rollout_workers": 2})
    stages = stages_for(cfg)
    if hook:
        hook(stages.engine)
    result = train(cfg, stages=stages)
    rewards = [json.loads(ln).get("reward/mean") for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    params = {k: v.detach().clone() for k, v in stages.model.state_dict().items()}
    stages.engine.close()
    return params, [r for r in rewards if r is not None], stages.engine


def assert_same(a, b):
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_chunks_cover_the_prompts_in_order():
    assert split_evenly(5, 2) == [(0, 3), (3, 5)]
    assert split_evenly(1, 3) == [(0, 1), (1, 1), (1, 1)]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("local"), "local")


def test_ray_actors_give_the_in_process_workers_run(tmp_path, local_run):
    params, rewards, pool = run(tmp_path, "ray")
    assert_same(local_run[0], params)
    assert rewards == local_run[1]
    assert pool.restarts == 0


def test_a_killed_rollout_actor_is_restarted_and_its_prompts_rerun(tmp_path, local_run):
    def kill_during_second_rollout(pool: WorkerPool):
        calls = {"generate": 0}
        call = pool._call

        def killing_call(worker, method, *args):
            future = call(worker, method, *args)
            if method == "generate":
                calls["generate"] += 1
                if calls["generate"] == 3:  # the second rollout's first chunk is in flight
                    ray.kill(worker)
            return future

        pool._call = killing_call

    params, rewards, pool = run(tmp_path, "ray", hook=kill_during_second_rollout)
    assert pool.restarts == 1
    assert_same(local_run[0], params)
    assert rewards == local_run[1]


def test_the_learner_runs_in_a_ray_actor_and_gives_the_in_process_run(tmp_path):
    """`dist.backend: ray` without stages: the loop runs in a learner actor placed beside its rollout actors."""
    from safetensors.torch import load_file

    on_disk = toy_run_on_disk(tmp_path)
    runs = {}
    for backend in ("local", "ray"):
        cfg = toy_run_config(tmp_path / backend, 3, **on_disk, rollout={"max_staleness": 1}, trainer={"threads": 1},
                             dist={"backend": backend, "rollout_workers": 1})  # 2 CPUs: learner + 1 worker
        result = train(cfg) if backend == "ray" else train(cfg, stages=build_stages(cfg))
        runs[backend] = load_file(str(result.run_dir / "checkpoints" / "step-000003" / "model" / "model.safetensors"))
    assert runs["local"].keys() == runs["ray"].keys()
    assert_same(runs["local"], runs["ray"])


def test_engine_servers_as_ray_actors_give_the_in_process_workers_tokens():
    """`dist.servers` with `dist.backend: ray`: hf engine servers as actors, weights broadcast through gloo."""
    from lmrl.engines import SamplingParams
    from lmrl.engines.server_pool import ServerPool, spec_for

    tok = make_tokenizer()
    learner = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    pool = ServerPool(learner, spec_for(learner, "hf", [tok.eos_token_id], tok.pad_token_id, False), servers=2,
                      backend="ray")
    workers = WorkerPool(learner, [tok.eos_token_id], tok.pad_token_id, False, workers=2)
    try:
        with torch.no_grad():
            for p in learner.parameters():
                p.mul_(1.5)  # an update the servers receive by broadcast, the in-process workers by reference
        pool.update_weights(None, 1)
        workers.update_weights(None, 1)
        prompts = [tok.encode(p) for p in ["q1 say 7", "hello", "a b c"]]
        params = SamplingParams(max_new_tokens=12, temperature=0.8)
        ours = pool.generate(prompts, 2, params, torch.Generator().manual_seed(3))
        theirs = workers.generate(prompts, 2, params, torch.Generator().manual_seed(3))
        assert [[c.token_ids for c in g] for g in ours] == [[c.token_ids for c in g] for g in theirs]
        assert {v for g in ours for c in g for v in c.policy_version} == {1}
        node = pool.ray.util.get_node_ip_address()  # where each actor runs, for the choice of a holder
        assert [pool.holders.node_of(i) for i in (0, 1)] == [node, node] and pool.holders.of(1)[0].node == node
    finally:
        pool.close()
        workers.close()
