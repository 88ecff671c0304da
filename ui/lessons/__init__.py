"""The page's teaching claims, each checked on the run it is shown beside: trace in, verdict out
(``verdicts``, and Flash-Verify's ``acceptance``). May import ``ui.block``, ``ui.canvas`` and
``ui.parts``, dllm_local's torch-free leaves, gradio and plotly; never torch."""
