"""Where prompts and added samples come from: samplers, group filters applied after scoring, sample
sources (`data.demonstrations`) and the batch sources of a step (`batches.source`: rollouts, or an offline
dataset); the per-sample inputs have their own package, `lmrl.inputs`."""
from lmrl.data.demonstrations import SAMPLE_SOURCES, load_source_state, sample_source, source_state
from lmrl.data.samplers import GROUP_FILTERS, SAMPLERS, UniformSampler, build_sampler
from lmrl.data.sources import BATCH_SOURCES, OfflineData
import lmrl.data.adaptive, lmrl.data.heapa, lmrl.data.rail  # noqa: F401,E401,E402  (register the adaptive samplers)
import lmrl.data.guidance  # noqa: F401,E402  (registers the sample sources for hard prompts)
import lmrl.data.replay  # noqa: F401,E402  (registers the replay source of recorded rollouts)
from lmrl.data.judge_rows import critic_rows_task  # noqa: E402  (registers the critic_rows task)

__all__ = ["BATCH_SOURCES", "GROUP_FILTERS", "OfflineData", "SAMPLERS", "SAMPLE_SOURCES", "UniformSampler",
           "build_sampler", "critic_rows_task", "load_source_state", "sample_source", "source_state"]
