"""Serving: the engine process that owns the model, and the page's session with it."""
