"""Prefix KV reuse across `generate` calls of the hf engine, for multi-turn episodes.

A multi-turn episode sends its whole conversation at every turn, and each turn's prompt extends the
previous call's prompt + completion. With `SamplingParams.keep_prefix` the engine keeps the KV of
every row it finishes (prompt and completion less the last sampled token, which is never fed), keyed
by those token ids; the next such call looks up each prompt's longest stored prefix and prefills only
the tokens after it. A prompt always feeds at least one token (a match is cropped to len(prompt) − 1).

Batch layout of a call with reuse: row i's stored KV (c_i tokens) is right-aligned in a cache of
width C = max c_i, its new tokens (s_i) right-aligned in an input of width S = max s_i; the 2-D
attention mask is zero in both padding regions and positions continue from c_i (the mask's cumsum).
Only caches made of plain full-attention layers (`DynamicLayer`, `ReservedLayer`) can be preloaded
so: models with sliding-window or linear-attention layers (hybrids) keep the plain path, no reuse.

Memory stays at one call's rows: a call with `keep_prefix` replaces every entry with its own rows
(entries it did not use belong to finished episodes), and `update_weights` drops them all (stale KV).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from lmrl.engines.kv_cache import ReservedLayer, decode_cache


@dataclass
class Entry:
    """The KV of one finished row, per layer [kv_heads, tokens, head_dim]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values)


def reusable(config) -> bool:
    """Whether every layer of the decode cache for `config` is plain full attention."""
    layers = decode_cache(config, reserve=0).layers
    return bool(layers) and all(type(layer) in (DynamicLayer, ReservedLayer) for layer in layers)


class PrefixStore:
    """Stored prefix KV, keyed by token ids, and counters of what reuse saved (`stats`).

    `stats` counts calls with `keep_prefix` only: prompt tokens, reused (not prefilled) prompt tokens,
    prefilled prompt tokens, and the bytes of KV kept now and at most."""

    def __init__(self, supported: bool):
        self.supported = supported
        self.entries: dict[tuple[int, ...], Entry] = {}
        self.stats = {"prompt_tokens": 0, "reused_tokens": 0, "prefill_tokens": 0, "kv_bytes": 0, "kv_bytes_peak": 0}

    def clear(self) -> None:
        self.entries = {}
        self.stats["kv_bytes"] = 0

    def match(self, prompt: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `prompt` (at most len(prompt) − 1 tokens) and its length."""
        best, best_len, ids = None, 0, tuple(prompt)
        for key, entry in self.entries.items():
            k = min(len(key), len(ids) - 1)
            if k > best_len and key[k - 1] == ids[k - 1] and key[:k] == ids[:k]:
                best, best_len = entry, k
        return best, best_len

    def take(self, prompts: list[list[int]]) -> list[tuple[Entry | None, int]]:
        """Each prompt's match; the store is emptied (the call stores its own rows) and counted."""
        matches = [self.match(p) for p in prompts]
        self.clear()
        reused = sum(k for _, k in matches)
        total = sum(len(p) for p in prompts)
        self.stats["prompt_tokens"] += total
        self.stats["reused_tokens"] += reused
        self.stats["prefill_tokens"] += total - reused
        return matches

    def keep(self, ids: list[int], layers, row: int, valid: torch.Tensor) -> None:
        """Store row `row` of the cache `layers` (its positions where `valid`) under the token ids `ids`."""
        entry = Entry([layer.keys[row][:, valid] for layer in layers],
                      [layer.values[row][:, valid] for layer in layers])
        old = self.entries.get(tuple(ids))
        self.entries[tuple(ids)] = entry
        self.stats["kv_bytes"] += entry.nbytes - (old.nbytes if old else 0)
        self.stats["kv_bytes_peak"] = max(self.stats["kv_bytes_peak"], self.stats["kv_bytes"])


def batch_inputs(prompts: list[list[int]], matches: list[tuple[Entry | None, int]], pad_token_id: int):
    """Input ids [B, S] (each prompt's tokens after its match, right-aligned), the attention mask
    [B, C + S] and the preloaded KV per layer as (keys, values) [B, kv_heads, C, head_dim] (None when C = 0)."""
    width = max(len(p) - k for p, (_, k) in zip(prompts, matches))
    prefix = max(k for _, k in matches)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), prefix + width), dtype=torch.long)
    for i, (p, (_, k)) in enumerate(zip(prompts, matches)):
        ids[i, width - (len(p) - k):] = torch.tensor(p[k:])
        attn[i, prefix - k: prefix] = 1
        attn[i, prefix + width - (len(p) - k):] = 1
    if not prefix:
        return ids, attn, None
    first = next(e for e, k in matches if k)
    kv = []
    for layer, (keys, values) in enumerate(zip(first.keys, first.values)):
        shape = (len(prompts), keys.shape[0], prefix, keys.shape[-1])
        k_all, v_all = keys.new_zeros(shape), values.new_zeros(shape)
        for i, (entry, k) in enumerate(matches):
            if k:
                k_all[i, :, prefix - k:] = entry.keys[layer][:, :k]
                v_all[i, :, prefix - k:] = entry.values[layer][:, :k]
        kv.append((k_all, v_all))
    return ids, attn, kv
