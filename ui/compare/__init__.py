"""The Compare tab: two settings on one prompt, timed side by side, and their answers compared like
with like. May import ``ui.engine``, ``ui.grid``, ``ui.parts`` and ``ui.run``, dllm_local's
torch-free leaves, gradio and plotly; never torch."""
