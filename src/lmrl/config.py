"""The typed configuration schema: one pydantic section per stage, and `Config` made of them.

Pydantic checks each field's type and range. Reading recipe files, applying overrides, expanding the
preset and running the validation stages is lmrl.loading's work: this module imports nothing of lmrl
but its errors, so that every layer can name a section's type.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_serializer, model_validator

from lmrl.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Section):
    """LoRA adapters through peft (docs/lora.md): only the adapters train; the base stays frozen."""

    r: int = Field(16, ge=1)  # adapter rank
    alpha: float = Field(32.0, gt=0)  # scale alpha / r on the adapter's output
    dropout: float = Field(0.0, ge=0, lt=1)  # dropout on the adapter's input
    target_modules: str | list[str] = "all-linear"  # "all-linear" (every linear layer but the head) or module names


class ModelConfig(Section):
    path: str = "default"  # "default" (embedded SmolLM2), a transformers directory, a .gguf file, or a hub id
    lora: LoraConfig | None = None  # None: full fine-tuning; {} for the defaults (r 16, alpha 32, all-linear)


class TaskConfig(Section):
    name: str = "reasoning_gym"  # registered task: reasoning_gym | jsonl | hf_dataset
    dataset: str = "basic_arithmetic"  # reasoning-gym dataset name, or a file / directory path
    params: dict[str, Any] = Field(default_factory=dict)  # generator settings (reasoning-gym)
    system_prompt: str | None = "Solve the problem. End your reply with 'Answer: <number>'."
    prompt_field: str = "question"
    answer_field: str = "answer"
    num_train: int = Field(2000, ge=1)
    # held-out rows; None: 10% of a dataset's rows, at most 100 (generated tasks: 100). docs/datasets.md
    num_eval: int | None = Field(None, ge=0)
    seed: int = 0
    max_prompt_tokens: int = Field(512, ge=1)
    # each training prompt is also rolled out with each instruction appended (row field `prompt_variant`
    # = 1, 2, …; the plain prompt is 0; `variant_of` = the prompt's uid), e.g. Policy Split's high-entropy mode
    prompt_variants: list[str] = Field(default_factory=list)
    # a reference completion built from the row's fields, e.g. "{solution}" or "Answer: {answer}"
    # (used by data.demonstrations; docs/methods/demonstrations.md); with an environment and
    # batches.source=demonstrations, a list: one template per policy turn of a worked episode (docs/stages/sft.md)
    demonstration: str | list[str] | None = None
    # the row field holding other policies' completions, [{"text": ..., "logprob": ...}, ...]
    # (data.demonstrations=peers, Mutual RL's PRP; docs/methods/demonstrations.md)
    peer_rollouts: str | None = None


class RewardComponent(Section):
    name: str
    weight: float = 1.0
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(None, gt=0)  # overrides reward.timeout_s (judges need longer)


class RewardConfig(Section):
    components: list[RewardComponent] = Field(default_factory=lambda: [RewardComponent(name="answer")])
    aggregation: str = "weighted_sum"
    aggregation_params: dict[str, Any] = Field(default_factory=dict)  # knobs of the aggregation (docs/rewards)
    timeout_s: float = Field(10.0, gt=0)
    retries: int = Field(0, ge=0)  # extra attempts when a component raises, times out or returns garbage
    on_error: Literal["exclude", "zero"] = "exclude"  # what a sample gets once the attempts are used up
    # a step whose share of samples with reward errors is above this stops the run (1.0: never; docs/rewards)
    max_error_rate: float = Field(0.5, ge=0, le=1)
    concurrency: int = Field(1, ge=1)  # samples a per-sample component scores at once (judges, sandboxed tests)
    workers: Literal["threads", "ray"] = "threads"  # ray: stateless components as Ray tasks (docs/scaling.md)
    accuracy_component: str = "answer"  # the component reported as accuracy (1.0 = correct)


class VllmEngineConfig(Section):
    """Settings of `rollout.engine: vllm` (docs/engines.md); the other engines ignore them."""
    max_model_len: int | None = Field(None, ge=1)  # None: task.max_prompt_tokens + the longest generation budget
    kv_cache_gib: float | None = Field(None, gt=0)  # None: CPU, room for a step's rows (≤ 2 GiB); CUDA, from the next
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)  # CUDA: share of GPU memory vLLM takes beside the learner
    enforce_eager: bool = True  # no CUDA graphs / torch.compile: quick start; false pays off on long GPU runs
    sleep_during_update: bool = False  # CUDA: offload vLLM's weights and drop its KV cache between rollouts


class RolloutConfig(Section):
    engine: str = "hf"  # hf | vllm (docs/engines.md)
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    vllm: VllmEngineConfig = Field(default_factory=VllmEngineConfig)
    # None: the synchronous loop; k ≥ 0: the asynchronous loop, step j's rollouts from policy version
    # max(0, j − 1 − k) while the learner trains on earlier batches (docs/scaling.md)
    max_staleness: int | None = Field(None, ge=0)
    weight_transport: str = "in_process"  # how new weights reach the rollout engine (async loop; docs/scaling.md)
    # async loop (docs/scaling.md): > 1 makes each batch in this many chunks, the learner training on each as it comes
    stream_chunks: int = Field(1, ge=1)
    # async loop: a batch (chunk) from its step's version (fixed, reproducible) or the newest the bound admits
    versions: Literal["fixed", "newest"] = "fixed"
    # what writes the training rollouts' completions (`lmrl list rollout-controllers`; docs/methods/tree_rollouts.md):
    # none (one generate call) or e.g. tree (segment-level branching), with its knobs
    controller: str | None = None
    controller_params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _async_modes(self) -> "RolloutConfig":
        if (self.stream_chunks > 1 or self.versions != "fixed") and self.max_staleness is None:
            raise ValueError("stream_chunks > 1 and versions: newest are modes of the asynchronous loop: "
                             "set rollout.max_staleness")
        if self.stream_chunks > self.prompts_per_step:
            raise ValueError(f"stream_chunks={self.stream_chunks} exceeds prompts_per_step={self.prompts_per_step}")
        return self


class DistConfig(Section):
    """Where the learner and the rollouts run (docs/scaling.md): one process, or torchrun ranks, with
    rollouts in the learner's process (none); rollouts spread over `rollout_workers` workers, each an
    `hf` engine with its own copy of the weights, as objects in this process (local) or as Ray actors
    (ray, the `ray` extra, the learner in an actor too); or, on Ray, `learner_ranks` data-parallel
    learner actors, each generating its share of every batch as torchrun ranks do. `placement` is the
    Ray placement group's strategy over the learner's and the workers' bundles. With `servers`, each
    worker is an engine server hosting `rollout.engine` (hf or vllm) in a process of its own (local)
    or a Ray actor (ray), its weights broadcast by the learner through a torch.distributed group."""
    backend: Literal["none", "local", "ray"] = "none"
    rollout_workers: int = Field(2, ge=1)
    worker_threads: int = Field(1, ge=1)  # torch threads (and Ray CPUs) per rollout worker
    max_restarts: int = Field(3, ge=0)  # a rollout worker that dies is restarted this often; its prompts re-run
    learner_ranks: int = Field(1, ge=1)  # > 1: data-parallel learner ranks as Ray actors (dist.backend: ray)
    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"  # Ray bundles over nodes
    servers: bool = False  # each rollout worker an engine server apart from the learner (docs/scaling.md)
    broadcast: Literal["auto", "gloo", "nccl"] = "auto"  # servers: the weight group's backend; auto: nccl on GPUs
    server_devices: list[str] = Field(default_factory=list)  # servers: one device each ("cuda:1", …); none: CPU
    broadcast_changed: bool = False  # servers: send only the tensors that moved since the last version

    @property
    def rollout_pool(self) -> bool:
        """Whether rollouts run on a pool of workers (one learner rank), not on each rank's own engine."""
        return self.backend != "none" and self.learner_ranks == 1


class DataConfig(Section):
    sampler: str = "uniform"  # uniform | hive | heapa | curriculum | rail (docs/data.md)
    sampler_params: dict[str, Any] = Field(default_factory=dict)  # the sampler's knobs (docs/data.md)
    group_filter: str = "none"  # none | nonzero_std (DAPO dynamic sampling)
    max_gen_batches: int = Field(10, ge=0)  # 0 = unlimited
    # the sample source (`lmrl list sample-sources`, or your own file.py:name): add task.demonstration to groups
    # (GFT, SGT) or task.peer_rollouts (PRP); roll out hard prompts again with hints (KnowRL), guidance
    # replayed into the group (TaoSR-AGRL) or privileged context (RISE-RL); replace each group by an earlier
    # run's recorded rollouts of its prompt (replay, REGEN)
    demonstrations: str = "none"
    source_params: dict[str, Any] = Field(default_factory=dict)  # knobs of hints | guided_replay | privileged | replay


class BatchesConfig(Section):
    """Where each step's batch comes from (`lmrl list sources`, docs/stages/index.md): the policy's own rollouts,
    scored by the reward (RL), or the rows of an offline dataset trained by the terms of `algo.terms` (SFT,
    preference optimisation, reward-model training)."""

    # rollouts | online_pairs | sft | demonstrations | pairs | rollout_pairs | unpaired, or your own file.py:name
    source: str = "rollouts"
    dataset: str | None = None  # an offline source's data: a .jsonl/.json/.csv/.parquet file, a save_to_disk directory, a hub id
    format: str = "auto"  # auto | messages | prompt_completion | text | preference | unpaired | stepwise (docs/stages/sft.md)
    params: dict[str, Any] = Field(default_factory=dict)  # the source's knobs: split, eval_dataset, assistant_only, …
    size: int = Field(16, ge=1)  # rows (pairs, for pairs) per step
    max_tokens: int = Field(1024, ge=8)  # a row's tokens, prompt included; longer rows are cut (keeping the start)
    num_eval: int = Field(0, ge=0)  # rows held out of the dataset (or taken from params.eval_dataset) for the eval loss
    # λ: each step, with this probability (a coin seeded by trainer.seed and the step), the step's dataset rows
    # have their completions regenerated by the current policy (GKD's student-data fraction); None: never
    on_policy: float | None = Field(None, ge=0.0, le=1.0)


def _plain(value: Any) -> Any:
    """`value` as config files can hold it: an in-process object (a judge given from Python) as its repr."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


class TermConfig(Section):
    """One more objective term by its registered name (algos/terms.py TERMS): + coef · term."""
    name: str
    coef: float = 1.0
    # the term's knobs, bound to its signature, and the settings it declares (`TermSpec.settings`)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_serializer("params", when_used="json")
    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        return _plain(params)


class ShaperConfig(Section):
    """One more reward or advantage transform by its registered name (algos/shapers.py SHAPERS)."""
    name: str
    params: dict[str, Any] = Field(default_factory=dict)  # the shaper's knobs, bound to its signature


class GuardConfig(Section):
    """Failure-mode guards with rollback (docs/guards.md): a step is bad when the importance ratio explodes,
    a loss or gradient is not finite, or the entropy collapses; `patience` bad steps in a row restore the
    last checkpoint saved before them, with the learning rate times `lr_factor`."""
    enabled: bool = False
    patience: int = Field(2, ge=1)  # consecutive bad steps that trip the guard
    ratio_bound: float = Field(2.0, gt=1)  # a token whose π_θ/π_behaviour leaves [1/bound, bound] is extreme
    max_ratio_share: float = Field(0.05, ge=0, le=1)  # bad step: a larger share of extreme tokens
    min_entropy: float | None = Field(None, ge=0)  # bad step: mean token entropy below this (None: not checked)
    lr_factor: float = Field(0.5, gt=0, le=1)  # the learning rate is multiplied by this at each rollback
    max_rollbacks: int = Field(3, ge=0)  # a trip after this many rollbacks stops the run with an error


class AlgoConfig(Section):
    preset: str = "grpo"
    advantage: str = "grpo"
    advantage_params: dict[str, Any] = Field(default_factory=dict)
    loss: str = "ppo_clip"
    loss_params: dict[str, Any] = Field(default_factory=dict)  # extra knobs of the chosen loss (docs/methods)
    eps_low: float = Field(0.2, ge=0)
    eps_high: float = Field(0.2, ge=0)
    dual_clip: float | None = Field(None, gt=1)
    aggregation: str = "token_mean"
    horizon: int | None = Field(None, ge=1)  # C of seq_mean_token_sum_norm (default: max_new_tokens)
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: str = "k3"
    kl_in_reward: bool = False  # fold β·k1 into token rewards instead of the loss
    entropy_coef: float = 0.0
    critic: bool = False  # train a value head on the policy's hidden states (critic-based estimators: gae, evpo)
    critic_lr: float = Field(1e-3, gt=0)  # learning rate of the value head
    critic_shares_trunk: bool = False  # true: the value loss also trains the policy's layers (shared backbone)
    value_coef: float = Field(1.0, ge=0)  # weight of the clipped value loss
    value_clip: float | None = Field(0.5, gt=0)  # clip of V around the prepare-time values (None: unclipped)
    rejected_tokens: Literal["drop", "keep"] = "drop"  # rejection losses: drop rejected tokens from the loss mask
    group_by: str | None = None  # task row field whose equal values form one advantage group (default: the prompt)
    guards: GuardConfig = Field(default_factory=GuardConfig)  # ratio / NaN / entropy guards with rollback
    # objective terms summed after the policy-gradient loss and those kl_coef, entropy_coef and critic switch
    # on, in this order (algos/terms.py TERMS; e.g. [{name: demo_nll, coef: 0.1}]; docs/architecture.md)
    terms: list[TermConfig] = Field(default_factory=list)
    # reward and advantage transforms applied by stage, in this order (algos/shapers.py SHAPERS; e.g.
    # [{name: overlong, params: {buffer: 16}}], [{name: cost_aware, params: {fraction: 0.5}}])
    shaping: list[ShaperConfig] = Field(default_factory=list)


class StopRule(Section):
    """Stop training after the first reading of `metric` above (or below) a threshold, or, with `drop`, more than
    `drop` below the best value it has had (while `while_rising`, when given, rose since its last reading: the
    over-optimisation rule of a proxy reward, docs/runs.md). A metric of the evaluation (`eval/...`) is read at
    each evaluation, any other at each step."""

    metric: str  # a name from the step's log (metrics.jsonl), e.g. reward/majority_vote
    above: float | None = None
    below: float | None = None
    drop: float | None = Field(None, ge=0)
    while_rising: str | None = None  # with `drop`: only while this metric rose since its last reading

    @model_validator(mode="after")
    def _one_threshold(self) -> "StopRule":
        if sum(x is not None for x in (self.above, self.below, self.drop)) != 1:
            raise ValueError("give exactly one of `above`, `below` and `drop`")
        if self.while_rising is not None and self.drop is None:
            raise ValueError("`while_rising` goes with `drop`")
        if self.while_rising is not None and self.while_rising.startswith("eval/") != self.metric.startswith("eval/"):
            raise ValueError(f"`while_rising` ({self.while_rising}) must be read when {self.metric} is: both "
                             "metrics of the evaluation (eval/...) or both of the step")
        return self

    @property
    def at_evaluation(self) -> bool:
        """Read from each evaluation's metrics (not the step's)."""
        return self.metric.startswith("eval/")


class TrainerConfig(Section):
    steps: int = Field(20, ge=1)  # the most steps; `stop_when` may end the run earlier
    # the steps it trains in, as [first, last] ranges (unset: every step; []: none, it only generates, as a
    # run that trains its roles alone); read within a cycle of `train_cycle` steps when set. Alternating phases
    # of roles (docs/roles.md): in the other steps it only generates
    train_steps: list[tuple[int, int]] | None = None
    train_cycle: int | None = Field(None, ge=1)
    stop_when: list[StopRule] = Field(default_factory=list)  # stopping rules on logged metrics (docs/runs.md)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    bf16: bool | Literal["auto"] = "auto"  # bf16 autocast (auto: where the hardware has fast bf16)
    micro_batch_tokens: int = Field(8192, ge=1)  # token budget per micro-batch (padded)
    share_prompt: bool = True  # a prompt's samples share one prompt pass in training (exact)
    # several rows in one packed row, attending within themselves, positions restarting (exact; less padding)
    pack_rows: bool = False
    mini_batches: int = Field(1, ge=1)  # optimiser steps per rollout batch
    epochs: int = Field(1, ge=1)  # passes over each rollout batch
    seed: int = 0
    # CPU threads: "auto" = the cores other processes leave idle, chosen before each step (docs/performance.md)
    threads: int | Literal["auto"] = Field("auto")
    # where the policy, reference, value head and optimiser live: auto = CUDA when available (docs/devices.md)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    gradient_checkpointing: bool = False  # recompute layer activations in backward: less memory, ~30% more time
    # several ranks under torchrun: none = a whole replica per rank; fsdp = FSDP2 shards of the weights,
    # gradients and optimiser state, checkpoints in torch.distributed.checkpoint format (docs/scaling.md)
    sharding: Literal["none", "fsdp"] = "none"
    cpu_offload: bool = False  # with sharding=fsdp: shards, gradients and optimiser state kept on the CPU

    @model_validator(mode="after")
    def _train_steps(self) -> "TrainerConfig":
        for first, last in self.train_steps or []:
            if not 1 <= first <= last or (self.train_cycle is not None and last > self.train_cycle):
                raise ValueError(f"train_steps: [{first}, {last}] is not a range of steps 1 ≤ first ≤ last"
                                 + (f" ≤ train_cycle ({self.train_cycle})" if self.train_cycle else ""))
        if self.train_cycle is not None and not self.train_steps:
            raise ValueError("train_cycle repeats train_steps, which is unset or empty")
        return self

    def trains_at(self, step: int) -> bool:
        """Whether it trains at `step` (from 1) under `train_steps` and `train_cycle`."""
        if self.train_steps is None:
            return True
        at = (step - 1) % self.train_cycle + 1 if self.train_cycle else step
        return any(first <= at <= last for first, last in self.train_steps)


class EvalConfig(Section):
    every: int = Field(0, ge=0)  # evaluate every N steps (0: only at start and end)
    at_start: bool = True
    at_end: bool = True
    num_prompts: int | None = Field(None, ge=1)  # default: all of task.num_eval
    samples: int = Field(1, ge=1)  # > 1: sampled completions per prompt for pass@k
    pass_k: list[int] = Field(default_factory=lambda: [1])
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1)


class RunConfig(Section):
    output_dir: str = "runs"
    name: str | None = None  # default: recipe name plus a timestamp
    overwrite: bool = False  # a new run into a directory holding a run deletes that run first (docs/runs.md)
    checkpoint_every: int = Field(10, ge=0)  # 0: only at the end
    keep_checkpoints: int = Field(2, ge=1)
    progress: bool = True
    # experiment trackers fed next to metrics.jsonl: tensorboard | wandb | mlflow (docs/trackers.md)
    trackers: list[str] = Field(default_factory=list)
    # append each step's scored rollouts to RUN/rollouts.jsonl, for offline training later (docs/methods/regen.md)
    save_rollouts: bool = False


class EnvConfig(Section):
    """A multi-turn environment (docs/environments.md): episodes of policy turns and observations, trained
    token-in-token-out. Without `name` the task is single-turn (one completion per prompt)."""

    name: str | None = None  # registered environment (tool_use, bandit) or your own `file.py:Class`
    params: dict[str, Any] = Field(default_factory=dict)  # the environment's own knobs
    max_turns: int = Field(8, ge=1)  # policy turns per episode; an episode still going then is truncated
    max_episode_tokens: int = Field(1024, ge=1)  # tokens after the prompt (policy + environment); beyond: truncated
    step_timeout_s: float = Field(30.0, gt=0)  # a reset/step taking longer excludes the episode
    concurrency: int = Field(8, ge=1)  # environment steps run at once (threads) within a turn round


class MixtureTask(Section):
    """One task of a mixture (docs/mixtures.md): its own sections, each over the run's own (nested keys merge,
    lists replace), and its share of each step's prompts."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")  # its metrics' prefix (`task/<name>/…`, `eval/<name>/…`)
    weight: float = Field(1.0, ge=0)
    task: dict[str, Any] = Field(default_factory=dict)  # over the run's `task` section
    reward: dict[str, Any] = Field(default_factory=dict)  # over `reward`
    env: dict[str, Any] = Field(default_factory=dict)  # over `env` (`{name: null}`: single-turn in a run with one)
    data: dict[str, Any] = Field(default_factory=dict)  # over `data`: only `sampler` and `sampler_params`


class MixturePoint(Section):
    """A point of a scheduled mixture: the weights at `step`, linear in between, held after the last point."""

    step: int = Field(ge=0)
    weights: dict[str, float]


class MixtureConfig(Section):
    """Several tasks in one run: each step's prompts are split among them by weight (docs/mixtures.md)."""

    tasks: list[MixtureTask] = Field(default_factory=list)  # empty: the run's one task
    # proportional: p ∝ weight; temperature: p ∝ (weight · training rows)^(1/temperature); schedule: p ∝ the
    # weights `schedule` gives the step; progress: by each task's learning progress (the three knobs below)
    sampling: Literal["proportional", "temperature", "schedule", "progress"] = "proportional"
    temperature: float = Field(1.0, gt=0)
    schedule: list[MixturePoint] = Field(default_factory=list)
    progress_window: int = Field(2, ge=1)  # progress = |score now − score `progress_window` observations ago|
    progress_smoothing: float = Field(0.5, ge=0, lt=1)  # EMA: m ← smoothing·m + (1 − smoothing)·progress
    progress_floor: float = Field(0.2, ge=0, le=1)  # p = floor·(weight share) + (1 − floor)·(progress share)


class RoleConfig(Section):
    """A role of the run besides the policy (a simulated user, an opponent, a judge), called by the environment or a
    reward; trained on its own samples when `trains` (docs/roles.md)."""

    # "adapter": its own LoRA adapter on the policy's base (needs model.lora); "policy": the policy's own weights
    # (self-play: its samples join the policy's update); else its own model ("default", a directory, a .gguf file)
    model: str = "adapter"
    trains: bool = True  # false: frozen, it only answers
    # it also rolls out each step's prompts itself, group_size each, as the policy does (a peer policy learning side
    # by side: Mutual RL's peers, PRISM's adapters); it needs the policy's tokenizer
    rollouts: bool = False
    reward: RewardConfig | None = None  # scores its samples (a role that trains must set it)
    algo: dict[str, Any] = Field(default_factory=dict)  # its objective: `algo` keys over the run's
    trainer: dict[str, Any] = Field(default_factory=dict)  # its optimiser: `trainer` keys over the run's (lr, …)
    lora: LoraConfig | None = None  # its adapter (model: adapter; default the policy's model.lora) or its model's
    max_new_tokens: int = Field(64, ge=1)  # the most tokens of one of its replies
    temperature: float = Field(0.7, gt=0)  # it samples at this temperature whatever its caller asks


class Config(Section):
    recipe: str | None = None
    description: str = ""
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    batches: BatchesConfig = Field(default_factory=BatchesConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    dist: DistConfig = Field(default_factory=DistConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    mixture: MixtureConfig = Field(default_factory=MixtureConfig)
    roles: dict[str, RoleConfig] = Field(default_factory=dict)  # trainable or frozen roles besides the policy

    # dotted keys the preset filled in (loading.build_config): with the field defaults, what the user did not choose
    _preset_filled: frozenset[str] = PrivateAttr(default=frozenset())
    # what loading said: a list an override or the recipe replaced, a key spelled as an earlier version did
    _notes: tuple[str, ...] = PrivateAttr(default=())

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per list an override or the recipe replaced (naming the old and the new entries), and per
        key spelled as an earlier version did (giving today's spelling); the CLI prints them first."""
        return self._notes

    def inherited(self, key: str) -> bool:
        """True when the user left the dotted `key` unset: its value is the preset's or the field's default."""
        *sections, name = key.split(".")
        node: BaseModel = self
        for section in sections:
            node = getattr(node, section)
        return key in self._preset_filled or name not in node.model_fields_set


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


# Settings that may change when a run is resumed: extending it, where and how often it reports and saves.
# Checkpoints are device-independent, so where and how memory-frugally the learner runs may change too.
RESUMABLE = ("trainer.steps", "trainer.threads", "trainer.device", "trainer.gradient_checkpointing", "trainer.pack_rows",
             "trainer.cpu_offload", "dist.backend", "dist.rollout_workers",
             "rollout.vllm.",
             "run.checkpoint_every", "run.keep_checkpoints", "run.progress", "run.trackers", "run.overwrite", "eval.")


def resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key not in ("params", "loss_params", "advantage_params", "aggregation_params"):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume_config(saved: Config, cfg: Config, run_dir: Path) -> None:
    """Refuse to continue a run under settings it did not start with (other than the resumable ones)."""
    before, after = _flatten(saved.model_dump(mode="json")), _flatten(cfg.model_dump(mode="json"))
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and not resumable(k))
    if changed:
        key = changed[0]
        raise ConfigError(f"resuming {run_dir}: {key} is {after.get(key)!r} but the run started with "
                          f"{before.get(key)!r}" + (f" (also differs: {', '.join(changed[1:])})" if changed[1:] else "")
                          + "; resume with the run's own config (`lmrl train --resume RUN`) or start a new run")
