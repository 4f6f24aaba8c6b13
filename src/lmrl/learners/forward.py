"""The learner's forward pass as one module: the decoder, then the LM head on the selected positions only.

`PackedForward` wraps a causal LM so that one `forward` call runs what the learner needs of it: the
decoder over packed rows, then the LM head on the positions that predict a generated token. Being one
module, it is the root unit the sharded learner hands to FSDP2 (`dist.sharded`): the root's hooks
gather the embeddings, final norm and LM head (tied or not) around that call, and each decoder layer
gathers its own weights.
"""
from __future__ import annotations

import torch


class PackedForward(torch.nn.Module):
    """`forward(...) -> (last hidden state, every hidden state or None, selected hidden states, their logits)`."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                rows: torch.Tensor, positions: torch.Tensor, output_hidden_states: bool = False):
        out = self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                       output_hidden_states=output_hidden_states, use_cache=False)
        selected = out.last_hidden_state[rows, positions]
        return out.last_hidden_state, out.hidden_states, selected, self.model.get_output_embeddings()(selected)
