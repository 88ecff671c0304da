"""The loader, split by job: ``find`` (a checkpoint's folder from a name, path or hub id),
``checks`` and ``shapes`` (what a checkpoint must pass before anything is built, read from its
headers), ``build`` (config, tokenizer and model from the family's spec), ``quantize`` (4-bit and
8-bit), ``placement`` (device, dtype, free memory, threads), ``footprint`` (parameters and bytes a
forward reads), and ``loader`` (``load``, ``load_guider`` and the handles). It reads the families
through their registered specs (``models.family``) and never names one."""
