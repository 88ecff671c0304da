"""The Tune tab: a sweep of one knob, its accuracy-against-speed figures, the AUP chart and where their
labels go. May import ``ui.engine``, ``ui.parts`` and ``ui.run``, dllm_local's torch-free leaves,
gradio and plotly; never torch."""
