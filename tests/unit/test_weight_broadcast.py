"""The weight broadcast's pure parts: a version's plan (buckets per dtype and size, tied names sent once,
skipped names left out), what the change tracker calls moved, a version broadcast over a real two-rank
gloo group, the choice of backend, and the `dist.servers` settings the config refuses."""
from __future__ import annotations

import threading

import pytest
import torch

from lmrl.config import ConfigError
from lmrl.engines.broadcast import Broadcaster, ChangeTracker, join, plan_weights, receive
from lmrl.engines.server_pool import resolve_broadcast
from lmrl.loading import build_config


def weights():
    emb = torch.arange(12.0).reshape(4, 3)
    return [("embed.weight", emb), ("norm.weight", torch.ones(3)), ("steps", torch.tensor([5, 6])),
            ("head.weight", emb), ("proj.weight", torch.full((2, 3), 2.0))]


def test_a_plan_sends_tied_weights_once_and_buckets_by_dtype_and_size():
    # float32: embed 48 B, norm 12 B, proj 24 B; int64: steps 16 B. A 64-byte bucket limit (64 / 2**20 MB)
    # holds embed + norm (60 B); proj starts a new one after the int64 bucket.
    plan, tensors = plan_weights(weights(), version=4, bucket_mb=64 / 2**20)
    assert [name for name, _, _ in plan.tensors] == ["embed.weight", "norm.weight", "steps", "proj.weight"]
    assert plan.aliases == {"head.weight": "embed.weight"}
    assert plan.buckets == [[0, 1], [2], [3]]
    assert plan.nbytes == 48 + 12 + 16 + 24 and plan.version == 4
    assert plan.tensors[2] == ("steps", (2,), torch.int64)
    skipped, _ = plan_weights(weights(), 5, bucket_mb=1.0, skip={"embed.weight", "steps"})
    assert [n for n, _, _ in skipped.tensors] == ["norm.weight", "proj.weight"]
    assert skipped.aliases == {} and skipped.buckets == [[0, 1]] and skipped.nbytes == 36


def test_the_tracker_calls_moved_what_changed_in_place_or_was_replaced():
    w = weights()
    tracker = ChangeTracker()
    assert tracker.unchanged(w) == set()  # nothing held yet
    tracker.record(w)
    assert tracker.unchanged(w) == {"embed.weight", "norm.weight", "steps", "head.weight", "proj.weight"}
    w[1][1].mul_(3.0)  # an in-place update moves the version counter
    w[4] = ("proj.weight", w[4][1].clone())  # the same values in another tensor (a folded LoRA layer)
    assert tracker.unchanged(w) == {"embed.weight", "steps", "head.weight"}
    tracker.forget()
    assert tracker.unchanged(w) == set()


def test_a_version_broadcast_over_a_two_rank_gloo_group_arrives_whole():
    """The learner's end in this thread, a server's end in another: the tensors, tied names, dtypes."""
    learner = Broadcaster("gloo", torch.device("cpu"), timeout_s=30.0)
    generation = learner.next_generation()
    plan, tensors = plan_weights(weights(), 1, bucket_mb=64 / 2**20)
    received = {}

    def server():
        group = join(learner.address, 1, 2, generation, "gloo", 30.0)
        received.update(receive(group, plan, torch.device("cpu")))

    thread = threading.Thread(target=server)
    thread.start()
    learner.form(2)
    learner.send(plan, tensors)
    thread.join(timeout=30)
    assert set(received) == {"embed.weight", "norm.weight", "steps", "proj.weight", "head.weight"}
    for name, t in weights():
        assert torch.equal(received[name], t) and received[name].dtype == t.dtype, name
    assert received["head.weight"] is received["embed.weight"]


def test_the_broadcast_backend_is_nccl_only_when_every_end_is_on_a_gpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_broadcast("auto", cpu, []) == "gloo"
    assert resolve_broadcast("auto", gpu, ["cuda:1", "cuda:2"]) == "nccl"
    assert resolve_broadcast("auto", gpu, ["cuda:1", "cpu"]) == "gloo"
    assert resolve_broadcast("gloo", gpu, ["cuda:1"]) == "gloo"


@pytest.mark.parametrize("dist_section, engine, message", [
    ({"backend": "local"}, "vllm", r"runs hf rollout workers.*dist.servers=true"),
    ({"servers": True}, "hf", r"dist.servers and its settings need dist.backend=local"),
    ({"backend": "local", "servers": True, "rollout_workers": 2, "server_devices": ["cuda:1"]}, "hf",
     r"names 1 devices for dist.rollout_workers=2"),
])
def test_server_settings_the_config_refuses(dist_section, engine, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"recipe": "quickstart", "rollout": {"engine": engine}, "dist": dist_section})


def test_servers_host_vllm():
    cfg = build_config({"recipe": "quickstart", "rollout": {"engine": "vllm"}, "dist": {"backend": "local", "servers": True}})
    assert cfg.dist.servers and cfg.rollout.engine == "vllm"


def test_with_lora_only_the_adapted_layers_are_sent_again():
    """`broadcast_changed` on a LoRA policy: the folded layers are new tensors at every sync, the frozen
    base's are the same tensors with unmoved version counters."""
    from lmrl.config import LoraConfig
    from lmrl.models import tiny_llama
    from lmrl.models.lora import apply_lora
    from lmrl.models.weights import inference_weights

    model = apply_lora(tiny_llama(64, hidden=32, layers=2, heads=4), LoraConfig(r=4, alpha=8,
                                                                                target_modules=["q_proj", "v_proj"]))
    tracker = ChangeTracker()
    first = list(inference_weights(model))
    tracker.record(first)
    again = list(inference_weights(model))
    adapted = {f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in ("q", "v")}
    assert {name for name, _ in again} - tracker.unchanged(again) == adapted
