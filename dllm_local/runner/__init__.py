"""The forward runner: every forward of a loaded model, the one place that decides how it runs.

The sampler's step, a block's store, the policies' verify and read-cache forwards, the exact-drift
shadow and a batch's packed forward all call ``runner_for(model, mode, attention=...)``; the runner times the
forward, pads its queries to a bucket of lengths (``buckets.py``) so that a run meets few shapes, and
runs it eagerly, compiled (``torch.compile(fullgraph=True)``), or compiled with CUDA graphs
(``modes.py``), attended by the backend it was made with (``models.attention_backends``). A mode
that cannot run falls back to eager and says so (``ForwardRunner.notice``).
May import ``dllm_local.models`` and the foundations; nothing above it.
"""
from .forward import Forward, ForwardRunner, runner_for
from .modes import MODES, resolve_mode

__all__ = ["Forward", "ForwardRunner", "MODES", "resolve_mode", "runner_for"]
