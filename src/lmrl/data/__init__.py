"""Where prompts, added samples and per-sample inputs come from: samplers, group filters applied
after scoring, sample sources (`data.demonstrations`) and input providers."""
from lmrl.data.demonstrations import SAMPLE_SOURCES, sample_source
from lmrl.data.inputs import PROVIDERS, InputContext
from lmrl.data.samplers import GROUP_FILTERS, SAMPLERS, UniformSampler

__all__ = ["GROUP_FILTERS", "PROVIDERS", "SAMPLERS", "SAMPLE_SOURCES", "InputContext", "UniformSampler",
           "sample_source"]
