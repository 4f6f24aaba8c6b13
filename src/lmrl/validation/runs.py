"""The checks of how a run goes: rollout workers, environment rewards, stop rules, probing samplers, streamed
chunks of the asynchronous loop, and a refresh pipeline's reward model against its policy."""
from __future__ import annotations

from lmrl.algos import ADVANTAGES, AGGREGATIONS, LOSSES
from lmrl.algos.shapers import SHAPERS, active_shapers
from lmrl.algos.terms import KEYED_TERMS, TERMS, active_terms
from lmrl.config import Config, ConfigError
from lmrl.data import BATCH_SOURCES, SAMPLERS
from lmrl.data.demonstrations import SAMPLE_SOURCES
from lmrl.recipe_files import references


def _rollout_workers(cfg: Config) -> None:
    """Rollout workers are `hf` engines; engine servers host hf or vllm; learner ranks as actors need Ray
    (docs/scaling.md)."""
    d = cfg.dist
    if d.backend != "none" and cfg.rollout.engine != "hf" and not d.servers:
        raise ConfigError(f"dist.backend={d.backend} runs hf rollout workers; rollout.engine={cfg.rollout.engine} "                           "runs in the learner's process or in engine servers: set dist.servers=true, or use "                           "dist.backend=none with it")
    if (d.servers or d.server_devices or d.broadcast_changed or d.broadcast != "auto") and d.backend == "none":
        raise ConfigError("dist.servers and its settings need dist.backend=local (server processes on this "                           "machine) or ray (Ray actors)")
    if d.server_devices and len(d.server_devices) != d.rollout_workers:
        raise ConfigError(f"dist.server_devices names {len(d.server_devices)} devices for "
                          f"dist.rollout_workers={d.rollout_workers} servers: give one per server")
    if d.servers and d.learner_ranks > 1:
        raise ConfigError("dist.servers serves one learner: keep dist.learner_ranks=1 with it")
    if d.learner_ranks > 1 and d.backend != "ray":
        raise ConfigError(f"dist.learner_ranks={d.learner_ranks} places learner ranks as Ray actors: set "
                          "dist.backend=ray (or launch the ranks with torchrun and keep dist.learner_ranks=1)")
    if d.learner_ranks > 1 and (cfg.rollout.max_staleness is not None or cfg.algo.guards.enabled):
        raise ConfigError("dist.learner_ranks > 1 (data-parallel ranks) uses the synchronous loop without guards: "
                          "unset rollout.max_staleness and keep algo.guards.enabled=false")


def _env_reward(cfg: Config) -> None:
    """An environment's rewards reach training only through the `env` reward component."""
    if cfg.env.name and "env" not in {c.name for c in cfg.reward.components}:
        raise ConfigError(f"env.name={cfg.env.name!r} but reward.components has no `env` component, so the "
                          "environment's rewards would not reach training: add it, e.g. "
                          "\"reward.components=[{name: env}]\" reward.accuracy_component=env (weight 0 to only log it)")


def _stop_rules(cfg: Config) -> None:
    """A rule on a metric of the evaluation is read at each evaluation: the run must evaluate as it trains."""
    for rule in (r for r in cfg.trainer.stop_when if r.at_evaluation):
        if not cfg.eval.every or cfg.eval.every >= cfg.trainer.steps:
            raise ConfigError(f"trainer.stop_when reads {rule.metric} at each evaluation: set eval.every below "
                              f"trainer.steps={cfg.trainer.steps} (e.g. eval.every=2), or name a metric of the step")
        if cfg.task.num_eval == 0 and cfg.eval.num_prompts is None and not cfg.batches.num_eval:
            raise ConfigError(f"trainer.stop_when reads {rule.metric} at each evaluation, and task.num_eval=0 holds "                               "no prompt out to evaluate")


def _sampler_probe(cfg: Config) -> None:
    """A sampler that probes prompts with the current policy (`probes(**knobs)`) needs the synchronous loop."""
    sampler = SAMPLERS.get(cfg.data.sampler)
    probes = getattr(sampler, "probes", None)
    probing = probes(**cfg.data.sampler_params) if probes is not None else getattr(sampler, "needs_probe", False)
    if probing and cfg.rollout.max_staleness is not None:
        raise ConfigError(f"data.sampler={cfg.data.sampler} probes prompts with the learner's current policy, which "                           "the asynchronous loop trains while rollouts run; use it without rollout.max_staleness")


def streaming_problems(cfg: Config) -> list[str]:
    """Why this config's batches cannot be consumed chunk by chunk (empty: they can). Read from the
    methods' declarations: the estimator's `group_local`, the aggregation's `denominator`, the loss's
    `batch_statistics`, their states."""
    a, t = cfg.algo, cfg.trainer
    advantage, loss = ADVANTAGES.spec(a.advantage), LOSSES.spec(a.loss)
    checks = [
        (not advantage.is_group_local(a.advantage_params), f"algo.advantage={a.advantage} does not declare "
         f"group_local=True with algo.advantage_params={a.advantage_params}: its advantages may read statistics of "
         "the whole batch"),
        (a.group_by is not None, "algo.group_by pools advantage groups across prompts, which chunks split"),
        *((SHAPERS.spec(s.name).whole_batch, f"the {s.name!r} shaper (algo.shaping) reads the whole batch")
          for s in active_shapers(a)),
        (loss.reads_whole_batch(a.loss_params),
         f"algo.loss={a.loss} with algo.loss_params={a.loss_params} reads a statistic of the whole batch, "
         "which each chunk would compute apart"),
        (advantage.state is not None or loss.state is not None,          f"algo.advantage={a.advantage} / algo.loss={a.loss} keep a state that learns from the whole batch"),
        (AGGREGATIONS.spec(a.aggregation).denominator is None,
         f"algo.aggregation={a.aggregation} declares no single denominator to divide the summed gradients by"),
        *((TERMS.spec(t.name).denominator != "aggregation",
           f"the {t.name!r} term ({KEYED_TERMS.get(t.name, 'algo.terms')}) has a denominator of its own")
          for t in active_terms(a)),
        (t.epochs * t.mini_batches > 1, "trainer.epochs and trainer.mini_batches must be 1: the update is one "                                         "optimiser step on the whole batch"),
        (cfg.data.group_filter != "none", f"data.group_filter={cfg.data.group_filter} re-rolls prompts until "                                           "enough groups pass: chunks could not be handed over before that"),
        (SAMPLE_SOURCES.spec(cfg.data.demonstrations).adds,
         f"data.demonstrations={cfg.data.demonstrations} adds samples to the "
                                            "assembled batch"),
    ]
    return [why for bad, why in checks if bad]


def _streaming(cfg: Config) -> None:
    """Refuse `rollout.stream_chunks` > 1 where chunk-by-chunk updates would not be the whole-batch update."""
    problems = streaming_problems(cfg) if cfg.rollout.stream_chunks > 1 else []
    if problems:
        raise ConfigError(f"rollout.stream_chunks={cfg.rollout.stream_chunks} trains on each chunk as it arrives, "
                          "which gives the whole-batch update only for a group-local preparation and one optimiser "
                          "step per batch; here:\n  " + "\n  ".join(problems))


def check_refresh(reward_model, policy, refresh) -> None:
    """A refresh pipeline's two stages (docs/pipelines.md#refresh): the reward model learns from labelled
    rollouts, and the policy stage records its rollouts, evaluates and keeps a checkpoint at each evaluation
    (what a rollback returns to), samples in step (the rollouts after a checkpoint come from its weights), stops
    on a `drop` rule of its evaluation, and reads the reward model (a `{from: <label>}` in its settings)."""
    rm, cfg, where = reward_model.config, policy.config, f"refresh: the policy stage {policy.label!r}"
    if rm.batches.source != "rollout_pairs":
        raise ConfigError(f"refresh: the reward-model stage {reward_model.label!r} trains on labelled rollouts: "
                          f"batches.source=rollout_pairs (it has {rm.batches.source})")
    rank_by = rm.batches.params.get("rank_by")
    if rank_by != cfg.reward.accuracy_component:
        raise ConfigError(f"refresh: the reward-model stage {reward_model.label!r} must rank its pairs by the gold "
                          f"component the policy stage grades with: batches.params.rank_by="
                          f"{cfg.reward.accuracy_component} (it has {rank_by}); ranked by the proxy's own reward "
                          "it would learn the proxy")
    if reward_model.round == 1 and not str(rm.batches.dataset or "").endswith(".jsonl"):
        raise ConfigError(f"refresh: the first reward model's data is a run's rollouts.jsonl, which the feedback "
                          f"extends line by line (batches.dataset={rm.batches.dataset})")
    if refresh.feedback_groups > cfg.rollout.prompts_per_step:
        raise ConfigError(f"refresh.feedback_groups={refresh.feedback_groups}: the fresh labels are the groups of "                           f"one step, rollout.prompts_per_step={cfg.rollout.prompts_per_step} of them")
    if not BATCH_SOURCES.spec(cfg.batches.source).policy_gradient:
        raise ConfigError(f"{where} trains on its rollouts: batches.source=rollouts (it has {cfg.batches.source})")
    drops = [rule for rule in cfg.trainer.stop_when if rule.drop is not None and rule.at_evaluation]
    if len(drops) != 1:
        raise ConfigError(f"{where} needs one trainer.stop_when rule with `drop` on a metric of the evaluation "
                          "(e.g. {metric: eval/accuracy, drop: 0.03, while_rising: eval/reward/reward_model}): "
                          "it says when the policy over-optimises the proxy")
    run = cfg.run
    if not run.save_rollouts:
        raise ConfigError(f"{where}: set run.save_rollouts=true (the next round's reward model learns from them)")
    if cfg.rollout.max_staleness is not None:
        raise ConfigError(f"{where}: rollout.max_staleness must be unset (the rollouts after a checkpoint must "                           "come from its weights)")
    if not run.checkpoint_every or cfg.eval.every % run.checkpoint_every:
        raise ConfigError(f"{where}: run.checkpoint_every must divide eval.every={cfg.eval.every} (a rollback "                           "goes back to an evaluated checkpoint)")
    if run.keep_checkpoints * run.checkpoint_every < cfg.trainer.steps:
        raise ConfigError(f"{where}: run.keep_checkpoints must keep every checkpoint (at least "
                          f"{-(-cfg.trainer.steps // run.checkpoint_every)}): a rollback may go back to any of them")
    if not any(ref["from"] == reward_model.label for ref in references(policy.tree)):
        raise ConfigError(f"{where} never reads the reward model: give its reward component the path "
                          f"{{from: {reward_model.label.rsplit('-', 1)[0]}}}")
