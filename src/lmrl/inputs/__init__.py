"""Per-sample inputs: their names (`vocabulary`), the one provider registry (`registry`) and the providers,
a module per family: from the samples and rows (`batch_fields`), per-turn credit (`credit`), the model's
log-probs and outputs (`model`), PMI (`pmi`), privileged-context teachers (`teacher`), the tree node of each
token of a tree rollout (`tree`) and the Monte-Carlo step values of each token (`mc_steps`).
Importing the package registers every provider, in this order."""
from lmrl.inputs.registry import (PROVIDERS, InputContext, ProviderSpec, provide, provided_inputs,
                                  requested_inputs)
import lmrl.inputs.batch_fields, lmrl.inputs.credit, lmrl.inputs.model  # noqa: F401,E401,E402  (register providers)
import lmrl.inputs.pmi, lmrl.inputs.teacher  # noqa: F401,E401,E402  (register the providers that encode prompts)
import lmrl.inputs.teacher_model  # noqa: F401,E402  (registers the teacher_kl term and its teacher's provider)
import lmrl.inputs.tree  # noqa: F401,E402  (registers the tree_nodes provider)
import lmrl.inputs.mc_steps  # noqa: F401,E402  (registers the mc_step_values provider)
import lmrl.inputs.stages  # noqa: F401,E402  (registers the stages provider)

__all__ = ["PROVIDERS", "InputContext", "ProviderSpec", "provide", "provided_inputs", "requested_inputs"]
