"""The Compare tab: two settings on one prompt, timed side by side, and their answers compared like
with like. May import ``ui.parts``, ``ui.grid``, ``ui.engine`` and dllm_local's torch-free leaves."""
