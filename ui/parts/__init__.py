"""The parts every tab shares: a trace's parts as the views read them, the look of every figure, the
numbers as HTML tables, timing that admits its noise, the endpoints' input schema, the export folder
and the presets. May import ``ui.block`` and ``ui.canvas``, dllm_local's torch-free leaves, gradio
and plotly; never torch."""
