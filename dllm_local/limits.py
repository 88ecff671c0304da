"""The bounds and defaults several layers share (settings, registry, trace files, CLI, page), in
one leaf module: it imports nothing of the project, so any module may read it without a cycle."""
from __future__ import annotations

# The longest answer region: a generation, a policy's count of positions or steps, an imported trace.
MAX_GEN_LENGTH = 4096
SEED_MAX = 2**63 - 1  # a torch generator's seed is an int64
MAX_TRACE_BYTES = 64 * 2**20  # a trace file, and the page's upload of one

# The sweep's grid and answer length when none is given (the CLI's sweep, the Tune tab).
SWEEP_THRESHOLDS = (0.5, 0.7, 0.8, 0.9)
SWEEP_BLOCK_SIZES = (8, 16, 32)
SWEEP_GEN_LENGTH = 64

# Runs decoding at once in the page engine's continuous batch (app.py --slots), and the prompt
# tokens a slot holds beyond a lab's longest answer (--max-gen-length).
SLOTS = 8
SLOT_PROMPT_ROOM = 512
# The most slots the engine's batch takes (decoding.batch.BatchRun refuses more). Each slot is one
# preallocated row of the KV cache (models/cache.py: slots x positions x layers x K/V), one row of
# the packed forward's attention and one request the batch plans on the host at every step, all
# linear in slots; the memory those rows need is the model's and the device's to bound. Given at
# start (app.py --slots, the CLI's and bench's --batch-size), a number past this is told there,
# not by every run after the page is up.
MAX_SLOTS = 4096

# How the engine's batch runs its requests' step forwards (app.py --batch-mode, bench and eval
# --batch-mode): "packed", one forward for them all (fastest; on a GPU in bf16 a request's tokens may
# depend on who shares its forward, since kernels are chosen by the packed shape), or "invariant",
# each request's own forward, the call it makes alone: its tokens are those it gets alone.
BATCH_MODES = ("packed", "invariant")
BATCH_MODE = "packed"
