"""The Tune tab: a sweep of one knob, its accuracy-against-speed figures, the AUP chart and where
their labels go. May import ``ui.parts``, ``ui.engine``, ``ui.figures`` and dllm_local's torch-free
leaves (the analysis package among them)."""
