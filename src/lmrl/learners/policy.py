"""The single-process learner: log-probs, micro-batching under a token budget, accumulation, updates.

It is blind to the algorithm: it asks it to prepare advantages and to score micro-batches
(`Algorithm.objective`), and only handles tensors, precision, memory and the optimiser.
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch

from lmrl.algos.losses import LossInputs
from lmrl.config import TrainerConfig
from lmrl.learners.packing import budget_units, fill_budget, pack, prompt_units
from lmrl.types import Batch


def selected_logprobs(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """Log-prob of `targets` under `logits` ([..., V]) and optionally the entropy, in float32."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


class Learner:
    """Policy (and frozen reference, when the algorithm needs one) with AdamW, in one process."""

    def __init__(self, model, cfg: TrainerConfig, temperature: float = 1.0, needs_reference: bool = False,
                 bf16: bool = False):
        self.model = model
        self.bf16 = bf16
        self.cfg = cfg
        self.temperature = temperature
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if needs_reference else None
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
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

    def micro_batches(self, batch: Batch) -> list[list[int]]:
        """Rows per micro-batch within the token budget; a prompt's samples stay together when shared."""
        if self.cfg.share_prompt:
            return [[r for unit in units for r in unit] for units in budget_units(batch, self.cfg.micro_batch_tokens)]
        return fill_budget(batch.attention_mask.sum(1).tolist(), self.cfg.micro_batch_tokens)

    def forward_logprobs(self, model, batch: Batch, with_entropy: bool):
        """Per-token log-probs [b, T-1] of the batch's own tokens (and entropies), temperature-scaled.

        Rows are packed (`packing.py`): with `share_prompt`, a prompt's samples share one prompt
        pass; only positions that predict a generated token reach the LM head.
        """
        units = prompt_units(batch) if self.cfg.share_prompt else [[r] for r in range(batch.num_rows)]
        packed = pack(batch, units, pad_id=0)
        with self._autocast():
            hidden = model.get_decoder()(
                input_ids=packed.input_ids.to(self.device), attention_mask=packed.attention_mask.to(self.device),
                position_ids=packed.position_ids.to(self.device)).last_hidden_state
            logits = model.get_output_embeddings()(hidden[packed.src_row, packed.src_pos])
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logp_flat, entropy_flat = selected_logprobs(logits, packed.targets.to(self.device), with_entropy)
        index = (packed.dst_row.to(self.device), packed.dst_t.to(self.device))
        shape = batch.completion_mask.shape
        logp = torch.zeros(shape, device=self.device).index_put(index, logp_flat)
        entropy = None if entropy_flat is None else torch.zeros(shape, device=self.device).index_put(index, entropy_flat)
        return logp, entropy

    @torch.no_grad()
    def logprobs(self, batch: Batch, reference: bool = False, rows: list[int] | None = None) -> torch.Tensor:
        """No-grad log-probs (for old or reference policies) of `rows` (default all), micro-batched."""
        model = self.reference if reference else self.model
        out = torch.zeros_like(batch.completion_mask)
        sub = batch if rows is None else batch.select(rows)
        targets = list(range(batch.num_rows)) if rows is None else rows
        for micro_rows in self.micro_batches(sub) if sub.num_rows else []:
            logp, _ = self.forward_logprobs(model, sub.select(micro_rows), with_entropy=False)
            out[[targets[r] for r in micro_rows], : logp.shape[1]] = logp.cpu()
        return out

    def update(self, batch: Batch, algorithm) -> dict[str, float]:
        """Optimise the policy on one prepared batch; returns averaged metrics.

        Rows the algorithm declares inert (zero loss and gradient, e.g. a group whose rewards are
        all equal) get no forward or backward pass; the loss denominators still count them, so the
        gradient is the one of the whole batch. Every mini-batch still takes its optimiser step.
        """
        self.model.train()
        inert = algorithm.inert_rows(batch).tolist()
        live = [r for r in range(batch.num_rows) if not inert[r]]
        steps_per_batch = self.cfg.epochs * self.cfg.mini_batches
        if steps_per_batch > 1:
            batch.extras["old_logp"] = self.logprobs(batch, rows=live)
        totals: dict[str, float] = {}
        weight_sum = 0.0
        skipped = 0
        grad_norms = []
        for _ in range(self.cfg.epochs):
            order = torch.randperm(batch.num_rows, generator=self.shuffle).tolist()
            for chunk in _split(order, self.cfg.mini_batches):
                scale = algorithm.scale(batch.select(chunk).completion_mask)
                mini = batch.select([r for r in chunk if not inert[r]])
                self._zero_grads()
                finite = True
                for rows in self.micro_batches(mini) if mini.num_rows else []:
                    micro = mini.select(rows)
                    loss, metrics = self._micro_step(micro, algorithm, scale)
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    loss.backward()
                    w = float(micro.completion_mask.sum())
                    weight_sum += w
                    for k, v in metrics.items():
                        totals[k] = totals.get(k, 0.0) + v * w
                norm = self._clip_and_norm() if finite else float("nan")
                if not finite or not math.isfinite(norm):
                    skipped += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    continue
                grad_norms.append(norm)
                self.optimizer_steps += 1  # counted first: weights may change from here on
                self.optimizer.step()
        self.scheduler.step()
        out = {k: v / max(weight_sum, 1.0) for k, v in totals.items()}
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["skipped_updates"] = float(skipped)
        out["inert_rows"] = float(sum(inert)) / max(batch.num_rows, 1)
        out["lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _micro_step(self, micro: Batch, algorithm, scale):
        logp, entropy = self.forward_logprobs(self.model, micro, with_entropy=algorithm.needs_entropy_grad)
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
            extras={k: v.to(logp.device) for k, v in micro.extras.items()},
        )
        loss, metrics = algorithm.objective(inputs, scale)
        if entropy is None:
            with torch.no_grad():
                metrics["entropy"] = _approx_entropy(logp, mask)
        else:
            metrics["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        metrics["mismatch_kl"] = float(((micro.behaviour_logprobs.to(mask.device) - logp.detach()) * mask).sum()
                                       / mask.sum().clamp(min=1))
        return loss, metrics

    def _zero_grads(self) -> None:
        """Zeroed (not freed) gradients: a mini-batch of only inert rows still steps AdamW exactly."""
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()

    def _clip_and_norm(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def _approx_entropy(logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Monte-Carlo entropy estimate from the sampled tokens: mean of -log p (no extra softmax pass)."""
    return float((-logp.detach() * mask).sum() / mask.sum().clamp(min=1))


def _split(items: list[int], parts: int) -> list[list[int]]:
    size = math.ceil(len(items) / parts)
    return [items[i: i + size] for i in range(0, len(items), size) if items[i: i + size]]
