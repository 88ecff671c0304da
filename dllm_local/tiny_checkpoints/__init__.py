"""Writers of the tiny checkpoints: ``train`` trains the embedded tiny model and its guider,
``fine_tune_block`` carries it into a block-diffusion format, and each ``random_*`` module writes a
random checkpoint of one released family in its exact on-disk format (the tests' fixtures). They
build models from ``models`` and read task data from ``tiny``; nothing imports them but the CLI,
the tests and their own ``python -m`` entry points."""
