"""The `hf` engine: a transformers model decoded with a KV cache, written for RL rollouts.

Samples of one prompt share one prefill (the prompt cache is computed once and repeated), finished
rows leave the batch (per-sample stop at EOS), and the log-prob of every sampled token under the
sampling distribution is returned as the behaviour log-prob. With `SamplingParams.keep_prefix` the
KV of finished rows is kept for the next such call, which prefills only what each prompt adds to a
stored prefix (multi-turn episodes; `lmrl.engines.prefix_cache`, counters in `prefix_stats`).
`score` gives the log-probs of given token ids instead (`lmrl serve`'s `/v1/completions` with `echo`).
"""
from __future__ import annotations

import contextlib
import inspect

import torch

from lmrl.engines.base import ENGINES, Completion, SamplingParams, TokenScores
from lmrl.engines.kv_cache import decode_cache
from lmrl.engines.prefix_cache import PrefixStore, batch_inputs, reusable


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k / nucleus (top-p) set with -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row with a single uniform each (inverse CDF).

    `torch.multinomial` draws an exponential variate per vocabulary entry: 11 % of decode time for a
    49k vocabulary on CPU. The CDF is accumulated in float64 so the last entries keep their mass.
    """
    cdf = probs.double().cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64).to(probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)


def next_token_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """LM-head logits [N, V] for hidden states [N, H], as W·hᵀ when the head is a plain matrix.

    With few rows (decoding), `linear(h, W)` runs at half the rate of `W @ hᵀ` on CPU BLAS (the
    49k-row head dominates); heads with a bias or logit soft-capping go through the module.
    """
    head = model.get_output_embeddings()
    plain = (type(head) is torch.nn.Linear and head.bias is None
             and getattr(model.config, "final_logit_softcapping", None) is None)
    if not plain:
        return head(hidden)
    return torch.mm(head.weight, hidden.t()).t().contiguous()


def cache_argument(decoder) -> str:
    """The keyword a decoder takes its KV cache by: `cache` from transformers 5.24, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


@ENGINES.register("hf", "transformers model, shared prefill per prompt, KV-cached decoding, early exit at EOS")
class HFEngine:
    """Generation with a transformers causal LM, in process (CPU or one GPU)."""

    shares_module = True  # generates with the module it was given (the learner's, unless a copy)

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, bf16: bool = False):
        self.model = model
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long)
        self.pad_token_id = pad_token_id
        self.bf16 = bf16
        self.version = 0
        self.prefix = PrefixStore(reusable(model.config))

    @property
    def prefix_stats(self) -> dict[str, int]:
        """Prefix reuse so far (calls with `keep_prefix`): prompt / reused / prefilled tokens, KV bytes kept."""
        return dict(self.prefix.stats)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def update_weights(self, named_tensors: dict[str, torch.Tensor] | None, version: int) -> dict[str, float]:
        if named_tensors:
            self.model.load_state_dict(named_tensors, strict=False)
        self.version = version
        self.prefix.clear()  # KV computed with the old weights
        return {}  # the module is the learner's: nothing to push

    def _autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            with self._autocast():
                tokens, logprobs, stops = self._decode(prompts, n, params, generator)
        finally:
            self.model.train(was_training)
        out: list[list[Completion]] = []
        for p in range(len(prompts)):
            group = []
            for j in range(n):
                row = p * n + j
                group.append(Completion(tokens[row], logprobs[row], "stop" if stops[row] else "length",
                                        [self.version] * len(tokens[row])))
            out.append(group)
        return out

    @torch.no_grad()
    def score(self, prompts: list[list[int]], top: int = 0, chunk_positions: int = 1024) -> list[TokenScores]:
        """The log-prob of each prompt token given the tokens before it, by one forward pass of the right-padded
        batch (the model's own distribution: temperature 1), with the `top` likeliest tokens at each of those
        positions. The first token has no prefix, so a prompt of L tokens has L - 1 scores. The LM head runs on
        `chunk_positions` positions at a time: memory is that many rows of the vocabulary, not the batch's."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, : len(p)], attn[r, : len(p)] = torch.tensor(p, dtype=torch.long), 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        try:
            with self._autocast():
                hidden = self.model.get_decoder()(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                                  position_ids=positions.to(self.device),
                                                  use_cache=False).last_hidden_state
                rows, cols = torch.nonzero(attn[:, 1:], as_tuple=True)  # position t predicts token t + 1
                targets = ids[rows, cols + 1].to(self.device)
                picked = hidden[rows.to(self.device), cols.to(self.device)]
                own, best, best_ids = [], [], []
                for start in range(0, len(targets), chunk_positions):
                    logp = torch.log_softmax(
                        self.model.get_output_embeddings()(picked[start: start + chunk_positions]).float(), -1)
                    own.append(logp.gather(1, targets[start: start + chunk_positions, None]).squeeze(1).cpu())
                    if top:
                        values, indices = logp.topk(top, -1)
                        best.append(values.cpu())
                        best_ids.append(indices.cpu())
        finally:
            self.model.train(was_training)
        own_lp = torch.cat(own).tolist() if own else []
        best_lp = torch.cat(best).tolist() if best else [[] for _ in own_lp]
        best_id = torch.cat(best_ids).tolist() if best_ids else [[] for _ in own_lp]
        out, at = [], 0
        for p in prompts:
            count = len(p) - 1
            out.append(TokenScores(own_lp[at: at + count],
                                   [list(zip(i, v)) for i, v in zip(best_id[at: at + count], best_lp[at: at + count])]))
            at += count
        return out

    def _decode(self, prompts, n, params: SamplingParams, generator):
        device = self.device
        keep = params.keep_prefix and self.prefix.supported
        matches = self.prefix.take(prompts) if keep else [(None, 0)] * len(prompts)
        ids, attn, prefix_kv = batch_inputs(prompts, matches, self.pad_token_id)
        ids, attn = ids.to(device), attn.to(device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        reserve = params.max_new_tokens + (ids.shape[1] if prefix_kv else 0)
        cache = decode_cache(self.model.config, reserve=reserve)
        for layer, (keys, values) in zip(cache.layers, prefix_kv or []):
            layer.update(keys.to(device), values.to(device))
        decoder = self.model.get_decoder()
        cached = {cache_argument(decoder): cache}
        hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True,
                         **cached).last_hidden_state
        logits = next_token_logits(self.model, hidden[:, -1, :]).float()
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, 0)
            attn = attn.repeat_interleave(n, 0)
            positions = positions.repeat_interleave(n, 0)
        total = logits.shape[0]
        next_pos = positions[:, -1:] + 1
        active = torch.arange(total, device=device)  # original row of each row still decoding
        tokens: list[list[int]] = [[] for _ in range(total)]
        logprobs: list[list[float]] = [[] for _ in range(total)]
        stopped = [False] * total
        eos = self.eos.to(device)
        for step in range(params.max_new_tokens):
            chosen, chosen_lp = self._sample(logits, params, generator)
            finished = torch.isin(chosen, eos)
            for r, tok, lp, fin in zip(active.tolist(), chosen.tolist(), chosen_lp.tolist(), finished.tolist()):
                tokens[r].append(tok)
                logprobs[r].append(lp)
                stopped[r] = fin
            last = step == params.max_new_tokens - 1 or bool(finished.all())
            if keep:  # rows leaving now: their cache holds the prompt and every token but the last
                for i in torch.nonzero(finished | last).squeeze(1).tolist():
                    r = int(active[i])
                    self.prefix.keep(prompts[r // n] + tokens[r][:-1], cache.layers, i, attn[i].bool())
            if last:
                break
            if bool(finished.any()):  # finished rows leave the batch and its cache
                idx = torch.nonzero(~finished).squeeze(1)
                cache.batch_select_indices(idx)
                active, chosen, attn, next_pos = active[idx], chosen[idx], attn[idx], next_pos[idx]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            hidden = decoder(input_ids=chosen.unsqueeze(1), attention_mask=attn, position_ids=next_pos,
                             use_cache=True, **cached).last_hidden_state
            logits = next_token_logits(self.model, hidden[:, -1, :]).float()
            next_pos = next_pos + 1
        return tokens, logprobs, stopped

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, generator):
        if params.greedy:
            logp = torch.log_softmax(logits, dim=-1)
            chosen = logits.argmax(-1)
        else:
            scaled = logits / params.temperature
            logp = torch.log_softmax(scaled, dim=-1)
            filtered = filter_logits(scaled, params.top_k, params.top_p)
            chosen = inverse_cdf_sample(torch.softmax(filtered, dim=-1), generator)
        return chosen, logp.gather(1, chosen.unsqueeze(1)).squeeze(1)
