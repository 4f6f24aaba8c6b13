"""Learner ranks as Ray actors across two nodes (two raylets on this machine, a CPU each): with
`dist.placement: STRICT_SPREAD` rank 0 and rank 1 land on different nodes, meet at the address rank 0
reports, and train as 2 torchrun ranks do — the same rewards and, bit for bit, the same weights; sharded
(`trainer.sharding: fsdp`), their gathered checkpoint is the sharded torchrun ranks' bit for bit."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import toy_run_config, toy_run_on_disk
from lmrl.dist import spawn_local
from lmrl.loops import train
from lmrl.loops.on_ray import placed_learners, train_placed

ray = pytest.importorskip("ray", reason="the ray extra is installed by .ci/run")
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    ray.shutdown()  # a local cluster another test started in this process
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def train_rank(parallel, cfg):
    return train(cfg).run_dir


def run_config(tmp_path, name, **dist):
    common = dict(**toy_run_on_disk(tmp_path), trainer={"threads": 1, "mini_batches": 2, "device": "cpu"},
                  run={"checkpoint_every": 2})
    return toy_run_config(tmp_path / name, 2, dist=dist, **common)


def weights_and_rewards(run_dir):
    weights = load_file(str(run_dir / "checkpoints" / "step-000002" / "model" / "model.safetensors"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return weights, [r["reward/mean"] for r in rows if "reward/mean" in r]


def test_two_learner_ranks_on_two_nodes_train_like_two_torchrun_ranks(tmp_path, two_nodes):
    cfg = run_config(tmp_path, "ray", backend="ray", learner_ranks=2, placement="STRICT_SPREAD")
    with placed_learners(cfg) as ranks:
        nodes = ray.get([rank.node.remote() for rank in ranks])
        result = train_placed(ranks, cfg)
    assert len(set(nodes)) == 2 and set(nodes) == {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert ray.util.placement_group_table() == {} or all(
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())

    torchrun_dir = spawn_local(train_rank, 2, run_config(tmp_path, "torchrun"))[0]
    ray_weights, ray_rewards = weights_and_rewards(result.run_dir)
    torchrun_weights, torchrun_rewards = weights_and_rewards(torchrun_dir)
    assert len(ray_rewards) == 2 and ray_rewards == torchrun_rewards
    assert ray_weights.keys() == torchrun_weights.keys()
    for key in ray_weights:
        assert torch.equal(ray_weights[key], torchrun_weights[key]), key


def test_sharded_learner_ranks_on_ray_train_like_sharded_torchrun_ranks(tmp_path, two_nodes):
    from lmrl.models.sharded_checkpoint import gather_weights

    def gathered(run_dir, name):
        return load_file(str(gather_weights(run_dir / "checkpoints" / "step-000002", tmp_path / name) / "model.safetensors"))

    sharded = {"threads": 1, "mini_batches": 2, "device": "cpu", "sharding": "fsdp"}
    cfg = toy_run_config(tmp_path / "ray", 2, dist={"backend": "ray", "learner_ranks": 2, "placement": "STRICT_SPREAD"},
                         **toy_run_on_disk(tmp_path), trainer=sharded, run={"checkpoint_every": 2})
    with placed_learners(cfg) as ranks:
        result = train_placed(ranks, cfg)
    reference = toy_run_config(tmp_path / "torchrun", 2, **toy_run_on_disk(tmp_path), trainer=sharded,
                               run={"checkpoint_every": 2})
    torchrun_dir = spawn_local(train_rank, 2, reference)[0]
    rewards = [[json.loads(x)["reward/mean"] for x in (d / "metrics.jsonl").read_text().splitlines()
                if "reward/mean" in x] for d in (result.run_dir, torchrun_dir)]
    assert len(rewards[0]) == 2 and rewards[0] == rewards[1]
    ray_weights, torchrun_weights = gathered(result.run_dir, "ray-whole"), gathered(torchrun_dir, "torchrun-whole")
    assert ray_weights.keys() == torchrun_weights.keys()
    for key in ray_weights:
        assert torch.equal(ray_weights[key], torchrun_weights[key]), key
