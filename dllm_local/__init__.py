"""dllm-local: accelerated diffusion-LLM decoding you can watch step by step.

Names are imported lazily so that the torch-free parts (the trace, the settings) can be used
by the page without loading torch. Importing the package turns off what would reach the network
unasked (``offline.py``).
"""
from importlib import import_module

from .offline import stay_offline

stay_offline()  # before the hub, Gradio or Ray is imported by anything of this package

_EXPORTS = {
    "DllmError": "errors", "ModelLoadError": "errors", "SequenceTooLongError": "errors", "SettingsError": "errors",
    "TraceError": "errors", "DecodingError": "errors",
    "ModelHandle": "models.loading.loader", "GuiderHandle": "models.loading.loader",
    "load": "models.loading.loader", "load_guider": "models.loading.loader",
    "Settings": "settings", "Trace": "trace", "StepRecord": "trace",
    "generate": "decoding.sampler", "stream": "decoding.sampler", "Result": "decoding.sampler",
    "generate_batch": "decoding.batch", "stream_batch": "decoding.batch", "BatchRun": "decoding.batch",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'dllm_local' has no attribute {name!r}")
