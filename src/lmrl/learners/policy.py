"""The learner: log-probs, micro-batching under a token budget, accumulation, updates (one process, or one rank).

It is blind to the algorithm: it asks it to prepare advantages and to score micro-batches
(`Algorithm.objective`), and only handles tensors, precision, memory and the optimiser. Beyond
log-probs, the packed forward can give the model outputs an algorithm declares (`MODEL_OUTPUTS`:
value-head values, hidden states, exact token entropies) at the generated positions, and a reward
model's score at each row's last token (or, for a process reward model, its class logits at each
generated token); the value head `Linear(hidden, 1)` and the score head `Linear(hidden, labels)` are
layers the learner owns when asked for a critic or a score head.

Data-parallel training goes through `parallel` (`lmrl.dist`): which rows this process trains on,
the global denominators, the gradient all-reduce; on one process those hooks do nothing. A batch
that arrives in parts (streaming) is trained part by part and stepped once (`StreamedUpdate`).

It runs on whatever device the model's parameters are on (docs/devices.md): the value head, the
reference and the optimiser state follow them; batches stay on the CPU and each micro-batch is
moved over. For a peft LoRA model the reference is the same model with its adapters disabled.
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch

from lmrl.algos.gather import MODEL_OUTPUTS
from lmrl.algos.logprobs import selected_logprobs
from lmrl.algos.losses import LossInputs
from lmrl.config import TrainerConfig
from lmrl.dist.data_parallel import Parallel
from lmrl.learners.forward import PackedForward
from lmrl.learners.packing import budget_units, fill_budget, group_budget, pack, prompt_units, row_groups, unit_bins
from lmrl.models.weights import is_peft
from lmrl.types import Batch


class Learner:
    """Policy (and frozen reference, when the algorithm needs one; and a value head, when it trains a
    critic) with AdamW, in one process or as one replica of a data-parallel run, on the device of the
    model's parameters.

    `critic_lr` is the value head's learning rate; with `critic_shares_trunk` the value loss also
    reaches the policy's layers, otherwise the head reads detached hidden states. `score_head`: a
    reward model's head (`score_head_for`) with that many labels (true or 1: a scalar; 2: a process
    reward model's bad/good classes), trained with the policy's learning rate and clipped with it, as
    one model. The reference is a frozen copy of the model, or for a peft model
    the model itself with its adapters disabled.
    `parallel`: the data-parallel hooks (default: one process); replicas start from rank 0's weights.
    """

    def __init__(self, model, cfg: TrainerConfig, temperature: float = 1.0, needs_reference: bool = False,
                 bf16: bool = False, critic: bool = False, critic_lr: float = 1e-3, critic_shares_trunk: bool = False,
                 score_head: bool | int = False, parallel: Parallel | None = None):
        self.parallel = parallel or Parallel()
        self.parallel.broadcast(model.parameters())
        self.model = model
        self.bf16 = bf16
        self.cfg = cfg
        self.temperature = temperature
        self.needs_reference = needs_reference
        copied = needs_reference and not is_peft(model)
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if copied else None
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.forward_module = PackedForward(model)
        # sharded: the parameters are each rank's shards from here on (the reference's too)
        self.parallel.wrap(self.forward_module, model, first_pass=lambda: self._idle_pass(backward=False))
        self.reference_forward = PackedForward(self.reference) if self.reference is not None else None
        if self.reference is not None:
            self.parallel.wrap(self.reference_forward, self.reference, frozen=True,
                               first_pass=lambda: self._idle_pass(False, self.reference_forward))
        self.value_head = None
        self.critic_shares_trunk = critic_shares_trunk
        # what it trains: the parameters that need gradients now (a role's adapter on a shared base is
        # the active one while its learner is built: `loops.roles`), clipped and stepped as the policy's
        self.trained_parameters = params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": params}]
        if critic:
            self.value_head = torch.nn.Linear(model.config.hidden_size, 1).to(self.device)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            groups.append({"params": list(self.value_head.parameters()), "lr": critic_lr, "weight_decay": 0.0})
        self.score_head = score_head_for(model, cfg.seed, int(score_head)).to(self.device) if score_head else None
        if self.score_head is not None:
            groups.append({"params": list(self.score_head.parameters())})
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                                           **_adamw_kernel([p for g in groups for p in g["params"]]))
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.shuffle = torch.Generator().manual_seed(cfg.seed)
        self.optimizer_steps = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def micro_batches(self, batch: Batch, whole_groups: bool = False) -> list[list[int]]:
        """Rows per micro-batch within the token budget; a prompt's samples stay together when shared, a
        group's rows when `whole_groups` (a pairwise term compares them: `Algorithm.pairwise`)."""
        if whole_groups:
            return group_budget(batch, self.cfg.micro_batch_tokens)
        if self.cfg.share_prompt:
            return [[r for unit in units for r in unit] for units in budget_units(batch, self.cfg.micro_batch_tokens)]
        return fill_budget(batch.attention_mask.sum(1).tolist(), self.cfg.micro_batch_tokens)

    def modules(self) -> dict[str, torch.nn.Module]:
        """Trainable modules besides the policy (saved and restored with checkpoints)."""
        heads = {"value_head": self.value_head, "score_head": self.score_head}
        return {name: head for name, head in heads.items() if head is not None}

    def forward_logprobs(self, model, batch: Batch, with_entropy: bool, outputs: frozenset[str] | set[str] = frozenset(),
                         hidden_layer: int = -1) -> dict[str, torch.Tensor]:
        """Per-token log-probs [b, T-1] of the batch's own tokens, temperature-scaled, and the asked outputs.

        Returns {"logp", "entropy" (None unless `with_entropy`), and each of `outputs`}: "values"
        [b, T-1] from the value head, "hidden" [b, T-1, H] (detached; `hidden_layer` indexes the
        decoder's hidden states), "token_entropy" [b, T-1] (detached), "score" [b] from the score
        head on the final-norm hidden state of each row's last token (its last position with
        attention 1, as transformers' `*ForSequenceClassification` pools a right-padded row),
        "token_scores" [b, T-1, labels] from the score head on the final-norm hidden state of each
        generated token's own position (position t: token t+1, the logits transformers'
        `*ForTokenClassification` gives that token), "logits"
        [b, T-1, V] the full vocabulary's logits before the temperature (with their gradient; zero off
        the generated positions).
        Position t is the one that predicts token t+1, as for the log-probs. Rows are packed
        (`packing.py`): with `share_prompt`, a prompt's samples share one prompt pass; only positions
        that predict a generated token reach the LM head and the value head, and only the rows'
        last tokens reach the score head.
        """
        unknown = set(outputs) - MODEL_OUTPUTS
        if unknown:
            raise ValueError(f"unknown model outputs {sorted(unknown)}; the learner computes {sorted(MODEL_OUTPUTS)}")
        with_entropy = with_entropy or "token_entropy" in outputs
        layer_states = "hidden" in outputs and hidden_layer != -1
        units = prompt_units(batch) if self.cfg.share_prompt else [[r] for r in range(batch.num_rows)]
        packed = pack(batch, units, pad_id=0, bins=unit_bins(batch, units) if self.cfg.pack_rows else None)
        where = (packed.src_row.to(self.device), packed.src_pos.to(self.device))
        with self._autocast():
            forward = self._forward_of(model)
            last_hidden, hidden_states, selected, logits = forward(
                packed.input_ids.to(self.device), packed.attention_mask.to(self.device),
                packed.position_ids.to(self.device), *where, output_hidden_states=layer_states)
        raw_logits = logits
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logp_flat, entropy_flat = selected_logprobs(logits, packed.targets.to(self.device), with_entropy)
        index = (packed.dst_row.to(self.device), packed.dst_t.to(self.device))
        shape = batch.completion_mask.shape

        def scatter(flat: torch.Tensor) -> torch.Tensor:
            return torch.zeros(shape + flat.shape[1:], device=self.device, dtype=flat.dtype).index_put(index, flat)

        result = {"logp": scatter(logp_flat), "entropy": None if entropy_flat is None else scatter(entropy_flat)}
        if "values" in outputs:
            if self.value_head is None:
                raise ValueError("values were asked for but this learner has no value head (critic=False)")
            features = selected if self.critic_shares_trunk else selected.detach()
            result["values"] = scatter(self.value_head(features.float()).squeeze(-1))
        if "hidden" in outputs:
            states = hidden_states[hidden_layer][where] if layer_states else selected
            result["hidden"] = scatter(states.detach().float())
        if "token_entropy" in outputs:
            result["token_entropy"] = result["entropy"].detach()
        if "logits" in outputs:  # the full vocabulary's, before the temperature (with their gradient)
            result["logits"] = scatter(raw_logits.float())
        if "score" in outputs:
            if self.score_head is None:
                raise ValueError("score was asked for but this learner has no score head (score_head=False)")
            last = last_hidden[packed.last_row.to(self.device), packed.last_pos.to(self.device)]
            result["score"] = self.score_head(last.float()).squeeze(-1)
        if "token_scores" in outputs:
            if self.score_head is None:
                raise ValueError("token_scores were asked for but this learner has no score head (score_head=0)")
            own = last_hidden[packed.src_row.to(self.device), packed.own_pos.to(self.device)]
            result["token_scores"] = scatter(self.score_head(own.float()))
        return result

    @torch.no_grad()
    def model_outputs(self, batch: Batch, outputs: set[str], hidden_layer: int = -1, model=None
                      ) -> dict[str, torch.Tensor]:
        """No-grad model outputs (see `forward_logprobs`) of every row, micro-batched, on the CPU; a
        per-row output ("score") is [B], the others [B, T-1, ...]. `model`: another model's (a teacher's,
        moved to the policy's device), for the outputs that need no head of the learner's."""
        model = self.model if model is None else model.to(self.device)
        full: dict[str, torch.Tensor] = {}
        with _evaluating(model):
            for micro_rows in self.micro_batches(batch):
                got = self.forward_logprobs(model, batch.select(micro_rows), with_entropy=False,
                                            outputs=outputs, hidden_layer=hidden_layer)
                for name in outputs:
                    value = got[name].cpu()
                    per_row = value.dim() == 1
                    if name not in full:
                        shape = (batch.num_rows,) if per_row else batch.completion_mask.shape + value.shape[2:]
                        full[name] = torch.zeros(shape, dtype=value.dtype)
                    if per_row:
                        full[name][micro_rows] = value
                    else:
                        full[name][micro_rows, : value.shape[1]] = value
        return full

    @torch.no_grad()
    def logprobs(self, batch: Batch, reference: bool = False, rows: list[int] | None = None, model=None
                 ) -> torch.Tensor:
        """No-grad log-probs (for old or reference policies, or another `model` such as a teacher, moved to the
        policy's device) of `rows` (default all), micro-batched, on the CPU.

        Computed in eval mode (no dropout), like the engine's behaviour log-probs.
        """
        if model is not None:
            model, context = model.to(self.device), contextlib.nullcontext()
        else:
            model, context = self._reference() if reference else (self.model, contextlib.nullcontext())
        out = torch.zeros_like(batch.completion_mask)
        sub = batch if rows is None else batch.select(rows)
        targets = list(range(batch.num_rows)) if rows is None else rows
        micro = self.micro_batches(sub) if sub.num_rows else []
        # sharded ranks run as many passes of the policy (or reference) as each other, agreed before the first
        shared = model is self.model or model is self.reference
        idle = self.parallel.passes(len(micro)) - len(micro) if shared else 0
        with _evaluating(model), context:
            for micro_rows in micro:
                logp = self.forward_logprobs(model, sub.select(micro_rows), with_entropy=False)["logp"]
                out[[targets[r] for r in micro_rows], : logp.shape[1]] = logp.cpu()
            for _ in range(idle):
                self._idle_pass(False, self._forward_of(model))
        return out

    def _forward_of(self, model) -> torch.nn.Module:
        """The forward module of the policy, of the reference (both sharded when the learner is), or of another model."""
        if model is self.model:
            return self.forward_module
        return self.reference_forward if model is self.reference else PackedForward(model)

    def _idle_pass(self, backward: bool, forward: torch.nn.Module | None = None) -> None:
        """A pass of the policy (or `forward`) on one two-token row whose loss weighs zero: a sharded rank's
        share of the collectives of a pass that another rank runs on its rows, adding nothing to the gradients."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        first = torch.zeros(1, dtype=torch.long, device=self.device)
        forward = forward or self.forward_module
        with self._autocast(), torch.set_grad_enabled(backward):
            logits = forward(ids, torch.ones_like(ids), torch.arange(2, device=self.device)[None], first, first)[3]
        if backward:
            (logits.float().sum() * 0.0).backward()

    @torch.no_grad()
    def evaluate(self, batch: Batch, algorithm) -> dict[str, float]:
        """The objective on a prepared batch without an update (a held-out loss): `loss`, and the terms'
        metrics averaged over the micro-batches, weighted by their tokens."""
        scale = algorithm.scale(algorithm.aggregation_mask(batch))
        totals, weights, loss = {}, {}, 0.0
        with _evaluating(self.model):
            for rows in self.micro_batches(batch, algorithm.pairwise):
                micro = batch.select(rows)
                value, metrics = self._micro_step(micro, algorithm, scale)
                loss += float(value)
                w = float(micro.completion_mask.sum())
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v * w
                    weights[k] = weights.get(k, 0.0) + w
        return {"loss": loss, **{k: v / max(weights[k], 1.0) for k, v in totals.items()}}

    def _reference(self):
        """The reference policy's module and the context it runs under: the frozen copy, or (peft) the
        policy with its adapters disabled, which is exactly the base model."""
        if not self.needs_reference:
            raise ValueError("reference log-probs were asked for but this learner has none (needs_reference=False)")
        if self.reference is not None:
            return self.reference, contextlib.nullcontext()
        return self.model, self.model.disable_adapter()

    def update(self, batch: Batch, algorithm, step_scheduler: bool = True) -> dict[str, float]:
        """Optimise the policy on one prepared batch; returns averaged metrics.

        Each metric is averaged over the micro-batches that report it, weighted by their tokens.
        `step_scheduler=False` leaves the learning-rate schedule where it is (an extra update within
        one training step, e.g. a replay).

        Rows the algorithm declares inert (zero loss and gradient, e.g. a group whose rewards are
        all equal) get no forward or backward pass; the loss denominators still count them, so the
        gradient is the one of the whole batch. Every mini-batch still takes its optimiser step.
        Denominators come from `algorithm.aggregation_mask` (the completion mask less the tokens the
        loss rejects), computed per mini-batch before its micro-batches run.

        Data-parallel, every rank passes the same batch and trains on its own rows (`parallel.shard`);
        the mini-batches, denominators, summed gradients and metrics are those of the whole batch.
        """
        self.model.train()
        inert = algorithm.inert_rows(batch).tolist()
        mine = self.parallel.shard(batch)
        own = [r for r in range(batch.num_rows) if mine[r]]
        live = [r for r in own if not inert[r]]
        steps_per_batch = self.cfg.epochs * self.cfg.mini_batches
        if algorithm.needs_old_logp:  # the loss mask depends on them, on every row of the denominators
            batch.extras["old_logp"] = self.logprobs(batch, rows=own)
        elif steps_per_batch > 1 and algorithm.policy_gradient:  # the ratio's denominator
            batch.extras["old_logp"] = self.logprobs(batch, rows=live)
        totals: dict[str, float] = {}
        weights: dict[str, float] = {}
        skipped = 0
        grad_norms, critic_norms = [], []
        for _ in range(self.cfg.epochs):
            for chunk in self._mini_batches(batch, algorithm.pairwise):
                chunk = [r for r in chunk if mine[r]]  # this process's rows of the mini-batch
                scale = self.parallel.global_scale(algorithm.scale(algorithm.aggregation_mask(batch.select(chunk))))
                self._zero_grads()
                finite = self._backward(batch.select([r for r in chunk if not inert[r]]), algorithm, scale,
                                        totals, weights)
                weights["loss"] = weights.get("loss", 0.0) + 1.0 / self.parallel.world_size  # per mini-batch
                norms = self._step(finite)
                if norms is None:
                    skipped += 1
                    continue
                grad_norms.append(norms[0])
                critic_norms.append(norms[1])
        return self._finish(step_scheduler, totals, weights, grad_norms, critic_norms, skipped,
                            float(sum(inert)) / max(batch.num_rows, 1))

    def _mini_batches(self, batch: Batch, whole_groups: bool) -> list[list[int]]:
        """One epoch's mini-batches: the rows shuffled (whole groups, with `whole_groups`) and cut in
        `trainer.mini_batches` parts."""
        if not whole_groups:
            return _split(torch.randperm(batch.num_rows, generator=self.shuffle).tolist(), self.cfg.mini_batches)
        groups = row_groups(batch)
        order = [groups[g] for g in torch.randperm(len(groups), generator=self.shuffle).tolist()]
        return [[r for group in part for r in group] for part in _split(order, self.cfg.mini_batches)]

    def streamed(self, algorithm, denominator: str):
        """One update on a batch that arrives in parts (`learners.streamed.StreamedUpdate`)."""
        from lmrl.learners.streamed import StreamedUpdate

        return StreamedUpdate(self, algorithm, denominator)

    def _backward(self, mini: Batch, algorithm, scale, totals: dict[str, float], weights: dict[str, float]) -> bool:
        """Forward and backward of `mini`'s micro-batches, adding to the gradients, to the token-weighted
        metric sums and to `totals["loss"]` (the objective: the sum of the micro-batches' losses, whose
        weight the caller adds); False (and the rest left out) at a non-finite loss.

        Sharded, every rank runs as many passes as the rank with the most micro-batches (`parallel.passes`),
        with zero weight where it has none left, and after a non-finite loss (its step is skipped on every
        rank) the rest of its passes too."""
        micro_rows = self.micro_batches(mini, algorithm.pairwise) if mini.num_rows else []
        idle = self.parallel.passes(len(micro_rows)) - len(micro_rows)  # agreed before the first pass
        finite = True
        for rows in micro_rows:
            if not finite:
                self._idle_pass(backward=True)
                continue
            micro = mini.select(rows)
            loss, metrics = self._micro_step(micro, algorithm, scale)
            finite = bool(torch.isfinite(loss))
            if not finite and not self.parallel.sharded:
                return False
            if finite:
                totals["loss"] = totals.get("loss", 0.0) + float(loss.detach())
                w = float(micro.completion_mask.sum())
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v * w
                    weights[k] = weights.get(k, 0.0) + w
            loss.backward()
        for _ in range(idle):
            self._idle_pass(backward=True)
        return finite

    def _step(self, finite: bool) -> tuple[float, float] | None:
        """Sum the gradients over ranks, clip, and take the optimiser step: (grad norm, critic grad norm),
        or None when it is skipped (a non-finite loss on any process, or a non-finite norm)."""
        finite = self.parallel.agree(finite)
        if finite:  # each process's loss is its share of the mini-batch's: the gradients add up
            self.parallel.reduce_gradients(self._trainable())
        norm = self._clip_and_norm(self._policy_parameters()) if finite else float("nan")
        critic_norm = self._clip_and_norm(self.value_head.parameters()) if finite and self.value_head else 0.0
        if not finite or not math.isfinite(norm) or not math.isfinite(critic_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer_steps += 1  # counted first: weights may change from here on
        self.optimizer.step()
        return norm, critic_norm

    def _finish(self, step_scheduler: bool, totals: dict[str, float], weights: dict[str, float],
                grad_norms: list[float], critic_norms: list[float], skipped: int, inert_share: float
                ) -> dict[str, float]:
        """Step the schedule and average the update's metrics."""
        if step_scheduler:
            self.scheduler.step()
        totals, weights = self.parallel.reduce_metrics(totals, weights)
        out = {k: v / max(weights[k], 1.0) for k, v in totals.items()}
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        if self.value_head is not None:
            out["critic/grad_norm"] = sum(critic_norms) / len(critic_norms) if critic_norms else float("nan")
        out["skipped_updates"] = float(skipped)
        out["inert_rows"] = inert_share
        out["lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _micro_step(self, micro: Batch, algorithm, scale):
        outputs = self.forward_logprobs(self.model, micro, with_entropy=algorithm.needs_entropy_grad,
                                        outputs=algorithm.needs, hidden_layer=algorithm.hidden_layer)
        logp, entropy = outputs.pop("logp"), outputs.pop("entropy")
        mask = micro.completion_mask.to(logp.device)
        old = micro.extras.get("old_logp")
        ref = micro.extras.get("ref_logp")
        inputs = LossInputs(
            logp=logp,
            old_logp=old.to(logp.device) if old is not None else logp.detach(),
            advantages=micro.advantages.to(logp.device),
            mask=mask,
            ref_logp=ref.to(logp.device) if ref is not None else None,
            entropy=entropy,
            extras={**{k: torch.as_tensor(v, device=logp.device) for k, v in micro.context.items()
                       if isinstance(v, (int, float))},
                    **{k: v.to(logp.device) for k, v in {**micro.extras, **micro.row_extras}.items()}, **outputs},
        )
        loss, metrics = algorithm.objective(inputs, scale)
        if entropy is None and algorithm.policy_gradient:  # sampled tokens: mean -log p estimates the entropy
            with torch.no_grad():
                metrics["entropy"] = _approx_entropy(logp, mask)
        elif entropy is not None:
            metrics["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        if algorithm.policy_gradient:
            metrics["mismatch_kl"] = float(((micro.behaviour_logprobs.to(mask.device) - logp.detach()) * mask).sum()
                                           / mask.sum().clamp(min=1))
        return loss, metrics

    def _policy_parameters(self):
        """The policy's parameters and the score head's (clipped together: one reward model)."""
        yield from self.trained_parameters
        if self.score_head is not None:
            yield from self.score_head.parameters()

    def _trainable(self):
        yield from self._policy_parameters()
        if self.value_head is not None:
            yield from self.value_head.parameters()

    def _zero_grads(self) -> None:
        """Zeroed (not freed) gradients: a mini-batch of only inert rows still steps AdamW exactly."""
        for p in self._trainable():
            if p.requires_grad:
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()

    def _clip_and_norm(self, parameters) -> float:
        """Clip (policy and value head separately, as verl's actor and critic) and return the norm."""
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else float("inf")
        return self.parallel.clip_grad_norm(parameters, max_norm)


def score_head_for(model, seed: int, labels: int = 1) -> torch.nn.Linear:
    """A reward model's head, `Linear(hidden, labels, bias=False)` on the CPU (1 label: a scalar RM; 2: a
    process RM's bad/good classes), initialised as transformers initialises a classification head (normal,
    std = the config's `initializer_range`), from a generator seeded with `seed` so that runs are
    reproducible."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = torch.nn.Linear(config.hidden_size, labels, bias=False)
    std = getattr(config, "initializer_range", None) or 0.02
    with torch.no_grad():
        head.weight.normal_(0.0, std, generator=torch.Generator().manual_seed(seed))
    return head


def _adamw_kernel(params: list[torch.Tensor]) -> dict[str, bool]:
    """Fused AdamW (one kernel for every tensor) when all parameters are on CUDA; multi-tensor elsewhere."""
    if params and all(p.is_cuda for p in params):
        return {"fused": True}
    return {"foreach": True}


@contextlib.contextmanager
def _evaluating(model):
    """Eval mode (no dropout) for a no-grad pass, restoring the previous mode after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _approx_entropy(logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Monte-Carlo entropy estimate from the sampled tokens: mean of -log p (no extra softmax pass)."""
    return float((-logp.detach() * mask).sum() / mask.sum().clamp(min=1))


def _split(items: list, parts: int) -> list[list]:
    size = math.ceil(len(items) / parts)
    return [items[i: i + size] for i in range(0, len(items), size) if items[i: i + size]]
