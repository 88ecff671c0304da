"""Canvas diffusion (DiffusionGemma, through transformers' own classes): ``run.CanvasRun``, its
loop over transformers' step functions, ``watch`` (hooks reading the decoder for the trace), and the
two leaves the schema needs, ``settings`` (a canvas model's knobs) and ``trace`` (a canvas step's
record). ``settings`` and ``trace`` are torch-free and import only the foundations; ``run`` and
``watch`` may import ``models`` and the decoding core's recorder."""
