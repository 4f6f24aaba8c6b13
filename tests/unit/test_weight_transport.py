"""Weight transports: every registered one delivers the exact tensors of the version sent, tied weights
included, and releasing a parcel frees what it held."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmrl.engines.weight_sync import WEIGHT_TRANSPORTS
from lmrl.models import tiny_model
from lmrl.models.weights import inference_weights


@pytest.mark.parametrize("name", ["in_process", "shared_file", "ray"])
def test_a_transport_delivers_the_version_sent(name):
    if name == "ray":
        pytest.importorskip("ray", reason="the ray extra is installed by .ci/run")
    model = tiny_model("llama_tied", vocab_size=64)
    sent = {k: v.clone() for k, v in inference_weights(model)}
    transport = WEIGHT_TRANSPORTS.get(name)()
    parcel = transport.send(inference_weights(model), version=7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the learner moves on: the parcel keeps version 7
    received = transport.receive(parcel)
    assert parcel.version == 7 and received.keys() == sent.keys()
    for k in sent:
        assert torch.equal(received[k], sent[k]), k
    transport.release(parcel)
    if name == "shared_file":
        assert not Path(parcel.payload[0] if parcel.payload else "").is_file()
