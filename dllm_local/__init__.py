"""dllm-local: accelerated diffusion-LLM decoding you can watch step by step."""
from .errors import DllmError, ModelLoadError, SequenceTooLongError, SettingsError
from .loader import ModelHandle, load

__all__ = ["DllmError", "ModelHandle", "ModelLoadError", "SequenceTooLongError", "SettingsError", "load"]
