"""Generation backends behind one interface; `hf` is built in, `vllm` is an optional extra."""
from lmrl.engines.base import ENGINES, Completion, Engine, SamplingParams
from lmrl.engines.build import build_engine, eos_ids, sampling_params
from lmrl.engines.hf import HFEngine

__all__ = ["ENGINES", "Completion", "Engine", "HFEngine", "SamplingParams", "build_engine", "eos_ids",
           "sampling_params"]
