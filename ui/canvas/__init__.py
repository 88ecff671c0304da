"""A canvas model's (DiffusionGemma's) parts of the page: its controls, its trace's parts, its grid
and side panel, its claims and its slide chips. May import ``ui.parts``, ``ui.grid`` and
dllm_local's torch-free leaves."""
