"""The page's door to the engine: one queue every request waits in (who asks, Stop per tab, places in
line, redraws throttled) and the opening every handler of a request shares. May import ``ui.lab``,
dllm_local's torch-free leaves, gradio and plotly; never torch."""
