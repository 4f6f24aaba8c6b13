"""Where prompts, added samples and per-sample inputs come from: samplers, group filters applied
after scoring, sample sources (`data.demonstrations`) and input providers."""
from lmrl.data.demonstrations import SAMPLE_SOURCES, load_source_state, sample_source, source_state
from lmrl.data.inputs import PROVIDERS, InputContext
from lmrl.data.samplers import GROUP_FILTERS, SAMPLERS, UniformSampler, build_sampler
import lmrl.data.adaptive, lmrl.data.heapa, lmrl.data.rail  # noqa: F401,E401,E402  (register the adaptive samplers)
import lmrl.data.guidance  # noqa: F401,E402  (registers the sample sources for hard prompts)
import lmrl.data.replay  # noqa: F401,E402  (registers the replay source of recorded rollouts)
import lmrl.data.turn_rewards  # noqa: F401,E402  (registers the per-turn rewards input of multi-turn episodes)

__all__ = ["GROUP_FILTERS", "PROVIDERS", "SAMPLERS", "SAMPLE_SOURCES", "InputContext", "UniformSampler",
           "build_sampler", "load_source_state", "sample_source", "source_state"]
