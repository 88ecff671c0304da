"""Errors a user can hit, each naming the problem in words rather than a deep stack trace."""


class DllmError(Exception):
    """Base class: everything the engine raises on purpose."""


class ModelLoadError(DllmError):
    """A model could not be found, read or placed where it was asked to go."""


class SettingsError(DllmError, ValueError):
    """A decoding setting is out of range; the message names the knob."""


class SequenceTooLongError(DllmError, ValueError):
    """Prompt plus generation would exceed the model's maximum sequence length."""


class BusyError(DllmError):
    """A run is already going; runs are never mixed."""


class OutOfMemory(DllmError):
    """The device ran out of memory; the cache was freed."""


class EngineError(DllmError):
    """The engine process ended unexpectedly (it is started again on the next request)."""


class DecodingError(DllmError):
    """A run broke the decoding loop's hard bound on forwards (a policy stopped committing)."""


class TraceError(DllmError, ValueError):
    """An imported trace is not one this build can show; the message names the first bad field."""


def schema_message(exc) -> str:
    """A schema's failures (a pydantic ``ValidationError``) as "field.path: rule", the first five."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors()[:5])
