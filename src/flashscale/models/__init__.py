"""Single-device model code (Llama family), configs, checkpoint conversion. Never imports torch.distributed."""

from flashscale.models.config import PRESETS, LlamaConfig, preset
from flashscale.models.llama import KVCache, Llama, lm_loss

__all__ = ["PRESETS", "KVCache", "Llama", "LlamaConfig", "lm_loss", "preset"]
