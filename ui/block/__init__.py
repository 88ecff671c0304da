"""A block-diffusion model's parts of the page: its trace's parts as the views read them, the block
cache's claim and LLaDA 2.1's editing told beside the grid. May import ``ui.lessons`` and
``ui.parts``, dllm_local's torch-free leaves, gradio and plotly; never torch."""
