"""The token grid: the answer region at one step as HTML boxes, the names of its tokens and ends of
text, and what a policy adds to it. May import ``ui.canvas`` and ``ui.parts``, dllm_local's
torch-free leaves, gradio and plotly; never torch."""
