"""Model acquisition and loading: the embedded default model, GGUF conversion, tiny test models."""
from lmrl.models.convert import convert_gguf, lmrl_home
from lmrl.models.default import pull_default_model
from lmrl.models.loading import load_model, load_tokenizer, resolve_model_path, tiny_llama, tiny_model, TINY_FAMILIES

__all__ = [
    "convert_gguf",
    "lmrl_home",
    "load_model",
    "load_tokenizer",
    "pull_default_model",
    "resolve_model_path",
    "tiny_llama",
    "tiny_model",
    "TINY_FAMILIES",
]
