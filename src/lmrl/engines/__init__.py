"""Generation backends behind one interface; `hf` is built in, `vllm` is an optional extra."""
from lmrl.engines.base import ENGINES, Completion, Engine, SamplingParams, TokenScores
from lmrl.engines.build import build_engine, eos_ids, sampling_params
from lmrl.engines.hf import HFEngine
from lmrl.engines.vllm import VLLMEngine

__all__ = ["ENGINES", "Completion", "Engine", "HFEngine", "SamplingParams", "TokenScores", "VLLMEngine",
           "build_engine", "eos_ids", "sampling_params"]
