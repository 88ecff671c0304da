"""Torch-free analysis both the engine and the page use: the cost model (roofline projections of a
trace onto a target GPU and model), the accuracy-under-parallelism frontier, and the schema of
results rows and reports. Imports only the leaves and foundations (settings, tiny tasks, values,
errors, devices), never torch, so the page may read it."""
