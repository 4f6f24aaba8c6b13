"""Typed, validated configuration: recipe YAML files, dotted command-line overrides, presets.

An unknown key, a wrong type or an impossible combination fails here, before any model loads,
with the key named and the nearest valid key suggested.
"""
from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


class ConfigError(ValueError):
    """A configuration problem, reported before any model loads."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = "default"  # "default" (embedded SmolLM2), a transformers directory, a .gguf file, or a hub id


class TaskConfig(Section):
    name: str = "reasoning_gym"  # registered task: reasoning_gym | jsonl | hf_dataset
    dataset: str = "basic_arithmetic"  # reasoning-gym dataset name, or a file / directory path
    params: dict[str, Any] = Field(default_factory=dict)  # generator settings (reasoning-gym)
    system_prompt: str | None = "Solve the problem. End your reply with 'Answer: <number>'."
    prompt_field: str = "question"
    answer_field: str = "answer"
    num_train: int = Field(2000, ge=1)
    num_eval: int = Field(100, ge=0)
    seed: int = 0
    max_prompt_tokens: int = Field(512, ge=1)
    # each training prompt is also rolled out with each instruction appended (row field `prompt_variant`
    # = 1, 2, …; the plain prompt is 0; `variant_of` = the prompt's uid), e.g. Policy Split's high-entropy mode
    prompt_variants: list[str] = Field(default_factory=list)
    # a reference completion built from the row's fields, e.g. "{solution}" or "Answer: {answer}"
    # (used by data.demonstrations; docs/methods/demonstrations.md)
    demonstration: str | None = None
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
    concurrency: int = Field(1, ge=1)  # samples a per-sample component scores at once (judges, sandboxed tests)
    accuracy_component: str = "answer"  # the component reported as accuracy (1.0 = correct)


class RolloutConfig(Section):
    engine: str = "hf"
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)


class DataConfig(Section):
    sampler: str = "uniform"
    group_filter: str = "none"  # none | nonzero_std (DAPO dynamic sampling)
    max_gen_batches: int = Field(10, ge=0)  # 0 = unlimited
    # add task.demonstration to groups (GFT, SGT) or task.peer_rollouts (PRP)
    demonstrations: Literal["none", "group", "rescue", "peers"] = "none"


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
    overlong_buffer: int = Field(0, ge=0)  # DAPO overlong shaping; 0 = off
    overlong_factor: float = Field(1.0, ge=0)
    critic: bool = False  # train a value head on the policy's hidden states (critic-based estimators: gae, evpo)
    critic_lr: float = Field(1e-3, gt=0)  # learning rate of the value head
    critic_shares_trunk: bool = False  # true: the value loss also trains the policy's layers (shared backbone)
    value_coef: float = Field(1.0, ge=0)  # weight of the clipped value loss
    value_clip: float | None = Field(0.5, gt=0)  # clip of V around the prepare-time values (None: unclipped)
    rejected_tokens: Literal["drop", "keep"] = "drop"  # rejection losses: drop rejected tokens from the loss mask
    group_by: str | None = None  # task row field whose equal values form one advantage group (default: the prompt)
    cost_aware_fraction: float = Field(0.0, ge=0)  # Cost-Aware GRPO: draws per row (0 = off; 0.5 = half the rows)
    demo_nll_coef: float = Field(0.0, ge=0)  # SGT: + coef · Σ_demo rows (−mean log p) / rows in the batch


class TrainerConfig(Section):
    steps: int = Field(20, ge=1)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    bf16: bool | Literal["auto"] = "auto"  # bf16 autocast (auto: where the hardware has fast bf16)
    micro_batch_tokens: int = Field(8192, ge=1)  # token budget per micro-batch (padded)
    share_prompt: bool = True  # a prompt's samples share one prompt pass in training (exact)
    mini_batches: int = Field(1, ge=1)  # optimiser steps per rollout batch
    epochs: int = Field(1, ge=1)  # passes over each rollout batch
    seed: int = 0
    # CPU threads: "auto" = the cores other processes leave idle, chosen before each step (docs/performance.md)
    threads: int | Literal["auto"] = Field("auto")


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
    checkpoint_every: int = Field(10, ge=0)  # 0: only at the end
    keep_checkpoints: int = Field(2, ge=1)
    progress: bool = True
    # experiment trackers fed next to metrics.jsonl: tensorboard | wandb | mlflow (docs/trackers.md)
    trackers: list[str] = Field(default_factory=list)


class Config(Section):
    recipe: str | None = None
    description: str = ""
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _combinations(self) -> "Config":
        a = self.algo
        if a.loss == "gspo" and a.dual_clip is not None:
            raise ValueError("algo.loss=gspo is a sequence-level ratio; algo.dual_clip applies to token ratios only")
        if a.kl_in_reward and a.kl_coef == 0:
            raise ValueError("algo.kl_in_reward=true needs algo.kl_coef > 0")
        if a.advantage in GROUP_ESTIMATORS and self.rollout.group_size < 2:
            raise ValueError(
                f"algo.advantage={a.advantage} compares samples of one prompt; rollout.group_size must be >= 2"
            )
        if a.overlong_buffer >= self.rollout.max_new_tokens:
            raise ValueError("algo.overlong_buffer must be smaller than rollout.max_new_tokens")
        if self.data.demonstrations == "peers":
            self._check_peers()
        elif self.data.demonstrations != "none" and not self.task.demonstration:
            raise ValueError(f"data.demonstrations={self.data.demonstrations} needs task.demonstration, a template "
                             "over the task row's fields (e.g. '{solution}' or 'Answer: {answer}')")
        if self.data.demonstrations == "rescue" and a.critic:
            raise ValueError("data.demonstrations=rescue leaves its rows out of the advantage estimate, which "
                             "algo.critic=true (value targets for every row) does not support; use group or no critic")
        if a.demo_nll_coef > 0 and self.data.demonstrations == "none":
            raise ValueError("algo.demo_nll_coef > 0 trains on demonstration rows, but data.demonstrations=none "
                             "adds none; set data.demonstrations=rescue (or group) and task.demonstration")
        if self.data.group_filter != "none" and self.rollout.group_size < 2:
            raise ValueError("data.group_filter needs rollout.group_size >= 2")
        return self

    def _check_peers(self) -> None:
        """Peer rollouts carry only a sequence log-prob, which only a sequence-level correction can use."""
        if not self.task.peer_rollouts:
            raise ValueError("data.demonstrations=peers needs task.peer_rollouts, the task row field holding "
                             "[{'text': ..., 'logprob': ...}, ...]")
        loss, agg = self.algo.loss, self.algo.loss_params.get("mis_seq_agg", "sum")
        if loss not in SEQUENCE_IS_LOSSES or agg != "sum":
            raise ValueError(f"data.demonstrations=peers weighs another policy's completions by the sequence ratio "
                             f"π_self(y)/π_peer(y), but algo.loss={loss} does not use it (token ratios do not exist "
                             f"across tokenizers); use algo.loss=ppo_clip_tis_seq (or ppo_clip_mis_seq with "
                             f"mis_seq_agg=sum)")


SEQUENCE_IS_LOSSES = {"ppo_clip_tis_seq", "ppo_clip_mis_seq"}  # weigh rows by π_old(y)/π_rollout(y)
GROUP_ESTIMATORS = {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "xgrpo", "gdpo", "rvpo", "entrocraft",
                    "eqlen", "p_grpo", "alpo", "prpo", "resrl"}

# A preset is a named bundle of dotted settings; anything set explicitly by the user wins.
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"algo.advantage": "grpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "dapo": {
        "algo.advantage": "grpo", "algo.loss": "ppo_clip", "algo.eps_low": 0.2, "algo.eps_high": 0.28,
        "algo.dual_clip": 10.0, "algo.aggregation": "token_mean", "algo.kl_coef": 0.0,
        "data.group_filter": "nonzero_std",
    },
    "dr_grpo": {"algo.advantage": "dr_grpo", "algo.loss": "ppo_clip", "algo.aggregation": "seq_mean_token_sum_norm",
                "algo.kl_coef": 0.0},
    "gspo": {"algo.advantage": "grpo", "algo.loss": "gspo", "algo.eps_low": 3e-4, "algo.eps_high": 4e-4,
             "algo.aggregation": "seq_mean_token_mean", "algo.dual_clip": None},
    "rloo": {"algo.advantage": "rloo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "reinforce_pp": {"algo.advantage": "reinforce_pp", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean",
                     "algo.kl_coef": 0.001, "algo.kl_in_reward": True},
    "ppo": {"algo.advantage": "gae", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean", "algo.critic": True},
    "evpo": {"algo.advantage": "evpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean", "algo.critic": True},
    "resrl": {"algo.advantage": "resrl", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "gdpo": {"algo.advantage": "gdpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "rvpo": {"algo.advantage": "rvpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "entrocraft": {"algo.advantage": "entrocraft", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean",
                   "algo.advantage_params": {"binary_to_signed": True}, "algo.kl_coef": 0.001},
    "eqlen": {"algo.advantage": "eqlen", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "xgrpo": {"algo.advantage": "xgrpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "alpo": {"algo.advantage": "alpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "prpo": {"algo.advantage": "prpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "p_grpo": {"algo.advantage": "p_grpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "cost_aware_grpo": {"algo.advantage": "grpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean",
                        "algo.cost_aware_fraction": 0.5},
    "htpo": {"algo.advantage": "grpo", "algo.loss": "htpo", "algo.eps_low": 0.2, "algo.eps_high": 0.28,
             "algo.dual_clip": 10.0, "algo.aggregation": "token_mean", "algo.kl_coef": 0.0},
    "cispo": {"algo.advantage": "grpo", "algo.loss": "cispo", "algo.eps_low": 1.0, "algo.eps_high": 0.28,
              "algo.aggregation": "token_mean"},
    "sapo": {"algo.advantage": "grpo", "algo.loss": "sapo", "algo.aggregation": "seq_mean_token_mean"},
    "grpo_or": {"algo.advantage": "grpo", "algo.loss": "output_reset", "algo.aggregation": "token_mean"},
    "gft": {"algo.advantage": "grpo", "algo.loss": "gft", "algo.aggregation": "token_mean"},
    "acrl": {"algo.advantage": "grpo", "algo.loss": "acrl", "algo.aggregation": "token_mean"},
    "hargo": {"algo.advantage": "hargo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "gepo": {"algo.advantage": "gepo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "pipo": {"algo.advantage": "pipo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean"},
    "grpo_chi2": {"algo.advantage": "grpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean",
                  "algo.kl_estimator": "f_chi2", "algo.kl_coef": 0.05},
    "gft_demo": {"algo.advantage": "grpo", "algo.loss": "gft", "algo.aggregation": "token_mean",
                 "data.demonstrations": "group", "task.demonstration": "Answer: {answer}"},
    "prp": {"algo.advantage": "grpo", "algo.loss": "ppo_clip_tis_seq", "algo.aggregation": "token_mean",
            "data.demonstrations": "peers", "task.peer_rollouts": "peer_rollouts"},
    "sgt": {"algo.advantage": "grpo", "algo.loss": "ppo_clip", "algo.aggregation": "token_mean",
            "data.demonstrations": "rescue", "task.demonstration": "Answer: {answer}", "algo.demo_nll_coef": 0.1},
    "policy_split": {"algo.advantage": "grpo", "algo.loss": "policy_split", "algo.aggregation": "token_mean",
                     "algo.group_by": "variant_of",
                     # exact entropy with its gradient keeps several [tokens, vocab] tensors: smaller micro-batches
                     "trainer.micro_batch_tokens": 2048,
                     "task.prompt_variants": ["Explore: consider several different approaches before you settle "
                                              "on an answer."]},
}
PRESET_DESCRIPTIONS = {
    "grpo": "GRPO: group-normalised advantages, PPO clip, token-mean",
    "dapo": "DAPO: clip-higher 0.2/0.28, dual-clip 10, token-mean, dynamic sampling, no KL",
    "dr_grpo": "Dr.GRPO: no std normalisation, sum over tokens / constant horizon, no KL",
    "gspo": "GSPO: sequence-level ratio clipped at 3e-4/4e-4, seq-mean-token-mean",
    "rloo": "RLOO: leave-one-out baseline, PPO clip",
    "reinforce_pp": "REINFORCE++: batch-whitened return-to-go, k1 KL folded into the reward",
    "ppo": "PPO: learned critic (value head), GAE advantages, clipped value loss, PPO clip",
    "evpo": "EVPO: critic advantages while the critic's explained variance > 0, else a batch-mean baseline",
    "resrl": "ResRL: negative tokens weighted by their residual off the positives' hidden-state subspace",
    "gdpo": "GDPO: each reward component group-normalised, summed, batch z-scored",
    "rvpo": "RVPO: SoftMin over per-component group advantages (penalises reward variance)",
    "entrocraft": "Entrocraft: RAFT++ / NSR / GRPO chosen by batch entropy against a scheduled band",
    "eqlen": "EqLen: GRPO advantages on equal-length segments of paired responses",
    "xgrpo": "XGRPO: GRPO with the baseline pooled over own and peer rewards (task field peer_rewards)",
    "alpo": "ALPO: text tokens get the text-reward advantage, speech tokens the acoustic one",
    "prpo": "PRPO: GRPO within each permutation plus GRPO of permutation means (task fields)",
    "p_grpo": "P-GRPO: GRPO advantages reweighted per token by PMI with the evidence (task field without it)",
    "cost_aware_grpo": "Cost-Aware GRPO: train on half the rows, drawn by |A|/sqrt(length), importance-weighted",
    "htpo": "HTPO: clip bounds and loss weights by token entropy and prompt difficulty (DAPO-style clip)",
    "cispo": "CISPO: REINFORCE with the IS weight clipped (at 1.28) and detached; no token loses its gradient",
    "sapo": "SAPO: soft sigmoid gate on the ratio instead of a hard clip, sharper for negative advantages, "
            "seq-mean-token-mean",
    "grpo_or": "GRPO-OR (Output Reset): one-sided squared pull of the log-ratio to a margin, no clip",
    "gft": "GFT: policy gradient with the 1/pi weight capped at 1/tau (tau = 0.1)",
    "acrl": "ACRL: PPO clip, tokens masked when train/rollout ratio leaves [1/c, c]; c adapts to the discrepancy",
    "hargo": "HARGO: GRPO advantages boosted by group contrast x reference doubt, group-softmax weighted",
    "gepo": "GEPO: GRPO advantages damped where the group's entropy leaves its history band (mu ± sigma)",
    "pipo": "PIPO: GRPO step, then a replay of the previous batch scaled by the reward-window verdict",
    "grpo_chi2": "GRPO regularised by the chi-squared divergence to the reference (coefficient 0.05)",
    "gft_demo": "GFT with the task's reference answer as one more group member (reads gold answers as data)",
    "prp": "PRP: another policy's rollouts (task field peer_rollouts) join each group, weighted min(π/π_peer, 2)",
    "sgt": "SGT rescue: groups with no success get the reference answer, trained by a supervised term (0.1)",
    "policy_split": "Policy Split: each prompt also rolled out with an exploration instruction; pooled GRPO, "
                    "entropy bonus on that mode",
}


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part!r} is not a section")
    node[parts[-1]] = value


def _has_dotted(tree: dict, key: str) -> bool:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _check_keys(tree: dict, model: type[BaseModel], prefix: str = "") -> None:
    """Reject unknown keys, naming the nearest valid one."""
    for key, value in tree.items():
        fields = model.model_fields
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{near[0]}'?" if near else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
        annotation = fields[key].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
            _check_keys(value, annotation, f"{prefix}{key}.")


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=value` → ("a.b", YAML-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. algo.loss=gspo)")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at column {len(key) + 2 + mark.column}" if mark else ""
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(err)}{where})") from None
    if isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads "2e-6" as a string
        except ValueError:
            pass
    return key.strip(), value


def _yaml_problem(err: yaml.YAMLError) -> str:
    return getattr(err, "problem", None) or str(err).splitlines()[0]


def read_yaml(path: Path) -> dict[str, Any]:
    """A recipe or run config as a mapping; a syntax error names the file, line and problem in one line."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {_yaml_problem(err)}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections")
    return loaded


def recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.exists():
        return path
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        raise ConfigError(f"recipe file {name_or_path} does not exist (current directory: {Path.cwd()})")
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    near = difflib.get_close_matches(name_or_path, known, n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ConfigError(f"no recipe {name_or_path!r}{hint} (shipped: {', '.join(known)})")


def load_config(recipe: str | None = "quickstart", overrides: list[str] | None = None) -> Config:
    """Load a recipe, apply dotted overrides, expand the preset, and validate everything."""
    tree: dict[str, Any] = {}
    if recipe:
        path = recipe_path(recipe)
        tree = read_yaml(path)
        tree.setdefault("recipe", path.stem)
    for item in overrides or []:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
    return build_config(tree)


def _check_sequence_bounds(tree: dict[str, Any], preset: str) -> None:
    """GSPO's clip bounds (3e-4/4e-4) fit a sequence ratio; with a token-ratio loss they clip almost every token."""
    algo = tree.get("algo") or {}
    loss = algo.get("loss", PRESETS[preset].get("algo.loss"))
    if preset == "gspo" and loss != "gspo" and not ("eps_low" in algo and "eps_high" in algo):
        raise ConfigError(f"algo.preset=gspo brings sequence-ratio clip bounds (algo.eps_low=3e-4, algo.eps_high=4e-4) "
                          f"but algo.loss={loss} clips token ratios with them, which clips almost every token; "
                          "set algo.eps_low and algo.eps_high explicitly (e.g. 0.2 / 0.2)")


# Losses defined with an aggregation of their own (verl uses sequence-mean for GSPO whatever the run's default).
LOSS_AGGREGATION = {"gspo": "seq_mean_token_mean"}


def _check_loss_aggregation(tree: dict[str, Any], preset: str) -> None:
    """A loss chosen without its aggregation must not silently take a preset's different one."""
    algo = tree.get("algo") or {}
    loss = algo.get("loss", PRESETS[preset].get("algo.loss"))
    wanted = LOSS_AGGREGATION.get(loss)
    inherited = PRESETS[preset].get("algo.aggregation", AlgoConfig.model_fields["aggregation"].default)
    if wanted and "aggregation" not in algo and inherited != wanted:
        raise ConfigError(f"algo.loss={loss} is defined with algo.aggregation={wanted}, but algo.preset={preset} "
                          f"brings algo.aggregation={inherited}; use algo.preset={loss}, or set algo.aggregation "
                          f"yourself ({wanted} as in the paper, or {inherited} to keep it)")


def build_config(tree: dict[str, Any]) -> Config:
    tree = copy.deepcopy(tree)
    _check_keys(tree, Config)
    preset = (tree.get("algo") or {}).get("preset", AlgoConfig.model_fields["preset"].default)
    if preset not in PRESETS:
        near = difflib.get_close_matches(str(preset), list(PRESETS), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown algo.preset {preset!r}{hint} (presets: {', '.join(PRESETS)})")
    _check_sequence_bounds(tree, preset)
    _check_loss_aggregation(tree, preset)
    for key, value in PRESETS[preset].items():
        if not _has_dotted(tree, key):
            _set_dotted(tree, key, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            lines.append(f"{loc or 'config'}: {e['msg']}" + (f" (got {e['input']!r})" if loc else ""))
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


# Settings that may change when a run is resumed: extending it, where and how often it reports and saves.
RESUMABLE = ("trainer.steps", "trainer.threads", "run.checkpoint_every", "run.keep_checkpoints", "run.progress", "run.trackers", "eval.")


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


def load_run_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """The config a run was started with (`run_dir/config.yaml`), with the overrides that are safe mid-run."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there, so it is not an lmrl run directory")
    tree = read_yaml(path)
    for item in overrides or []:
        key, value = parse_override(item)
        if not resumable(key):
            raise ConfigError(f"{key} cannot change when resuming {run_dir}: the run would continue under other "
                              f"settings than it started with. Settings that may change: "
                              f"{', '.join(k + '*' if k.endswith('.') else k for k in RESUMABLE)}. "
                              f"Start a new run to change {key}")
        _set_dotted(tree, key, value)
    return build_config(tree)


def check_resume_config(saved: Config, cfg: Config, run_dir: Path) -> None:
    """Refuse to continue a run under settings it did not start with (other than the resumable ones)."""
    before, after = _flatten(saved.model_dump(mode="json")), _flatten(cfg.model_dump(mode="json"))
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and not resumable(k))
    if changed:
        key = changed[0]
        raise ConfigError(f"resuming {run_dir}: {key} is {after.get(key)!r} but the run started with "
                          f"{before.get(key)!r}" + (f" (also differs: {', '.join(changed[1:])})" if changed[1:] else "")
                          + "; resume with the run's own config (`lmrl train --resume RUN`) or start a new run")
