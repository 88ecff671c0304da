"""The decoding engine's core for masked and block diffusion: ``sampler.Run`` (one request's loop,
step by step), ``batch.BatchRun`` (several runs over one packed forward), the model calls the
policies make, the recorder that turns each step into the trace, and where a run's blocks sit.
May import ``policies``, ``models``, ``canvas`` (a canvas model's run is handed over there) and the
leaves (settings, trace, prompts, softmax, result); nothing above it (experiments, serving, ui)."""
