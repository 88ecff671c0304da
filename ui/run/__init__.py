"""The Run tab: its layout, its settings coming in, the live run and its status line, the views of one
step (grid, numbers, figures, verdicts), replay, branching and the position panel, trace files, the
presenter view and the slides export. May import ``ui.block``, ``ui.canvas``, ``ui.engine``,
``ui.figures``, ``ui.grid``, ``ui.lab``, ``ui.lessons``, ``ui.model`` and ``ui.parts``, dllm_local's
torch-free leaves, gradio and plotly; never torch."""
