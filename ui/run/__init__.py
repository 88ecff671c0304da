"""The Run tab: its layout, its settings coming in, the live run and its status line, the views of
one step (grid, numbers, figures, verdicts), replay, branching and the position panel, trace files,
the presenter view and the slides export. May import ``ui.parts``, ``ui.grid``, ``ui.figures``,
``ui.lessons``, ``ui.block``, ``ui.canvas``, ``ui.model``, ``ui.engine`` and dllm_local's torch-free
leaves; never torch."""
