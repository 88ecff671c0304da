"""The Run tab's model box: which models the page may load, loading one on request, and downloads from
the hub when the page allows them. May import ``ui.block``, ``ui.canvas``, ``ui.engine``, ``ui.lab``,
``ui.figures``, ``ui.parts`` and ``ui.run``, dllm_local's torch-free leaves, gradio and plotly;
never torch."""
