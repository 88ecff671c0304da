"""The page's door to the engine: one queue every request waits in (who asks, Stop per tab, places in
line, redraws throttled) and the opening every handler of a request shares. May import
``ui.parts`` and dllm_local's torch-free leaves; it talks to the engine through the Session."""
