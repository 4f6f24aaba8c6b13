"""TLPO's token-level objectives at error positions: token-DPO and unlikelihood, as pure tensor functions.

TLPO (docs/methods/tlpo.md) — confidence: low — reconstructed from the abstract. At each error position t
(the first token e of a wrong-language span) an alternative a⁺ that keeps the reply in the target language
is found; the token pair source (`data.token_pairs`) makes each position one pair of rows that share the
prefix y_<t and end in a⁺ (chosen) or e (rejected), with a loss mask on that last token only. Over such
pairs, sums over the loss mask are the log-probs of one token, so

- token-DPO is the `dpo` term itself: ℓ = −logσ(β[(logπ(a⁺) − logπ_ref(a⁺)) − (logπ(e) − logπ_ref(e))]);
- unlikelihood is the `unlikelihood` term below: ℓ = −log(1 − π(e | y_<t)), on the rejected row.

Both put a pair's loss on its two rows and are declared `denominator="sequences"`: the objective is the
mean over error positions, exactly, however pairs are split into micro-batches. No other token of the
sequence is in the loss mask, so nothing else receives gradient.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lmrl.algos.losses import LossInputs
from lmrl.algos.preference import PAIR_INPUTS, Pairs, sequence_logp
from lmrl.algos.preference_losses import log1mexp
from lmrl.algos.terms import TERMS


def unlikelihood_loss(logp_error: torch.Tensor) -> torch.Tensor:
    """−log(1 − π(e)) from log π(e) [P]; computed as −log(1 − e^{log π}) stably (`log1mexp`)."""
    return -log1mexp(logp_error.float().clamp(max=-1e-6))


def token_dpo_loss(logp_alt: torch.Tensor, logp_error: torch.Tensor, ref_alt: torch.Tensor, ref_error: torch.Tensor,
                   beta: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-DPO per error position [P]: (loss, z) with z = (logπ(a⁺) − logπ_ref(a⁺)) − (logπ(e) − logπ_ref(e)) and
    loss = −logσ(βz): DPO's sigmoid loss with one-token completions (what the `dpo` term computes on token pairs)."""
    z = (logp_alt - ref_alt) - (logp_error - ref_error)
    return -F.logsigmoid(beta * z), z.detach()


@TERMS.register("unlikelihood", "TLPO: −log(1 − π(e)) of each token pair's rejected token (the wrong-language "
                "token at an error position), the mean over pairs", inputs={"logp", *PAIR_INPUTS},
                denominator="sequences", pairwise=True)
def unlikelihood(inputs: LossInputs, mask: torch.Tensor):
    """On pairs of one-token completions (`batches.source=token_pairs`) the rejected row's log-prob is log π(e);
    longer completions would make it the log-probability of the whole completion (still a valid unlikelihood)."""
    pairs = Pairs.of(inputs.extras)
    _, logp_error = pairs.split(sequence_logp(inputs.logp, mask))
    loss = unlikelihood_loss(logp_error)
    return pairs.on_rows(loss), {"tlpo/unlikelihood": float(loss.detach().mean()),
                                 "tlpo/error_prob": float(logp_error.detach().exp().mean())}
