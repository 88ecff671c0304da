"""Experiments: benchmarks, sweeps, evaluation on task suites, and the roofline cost model."""
