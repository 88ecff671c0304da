"""The page's teaching claims, each checked on the run it is shown beside: trace in, verdict out
(``verdicts``, and Flash-Verify's ``acceptance``). May import ``ui.parts``, ``ui.block``,
``ui.canvas`` and dllm_local's torch-free leaves."""
