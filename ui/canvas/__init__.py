"""A canvas model's (DiffusionGemma's) parts of the page: its controls, its trace's parts, its grid and
side panel, its claims and its slide chips. May import ``ui.block``, ``ui.grid`` and ``ui.parts``,
dllm_local's torch-free leaves, gradio and plotly; never torch."""
