"""The Run tab's model box: which models the page may load, loading one on request, and downloads
from the hub when the page allows them. May import ``ui.parts``, ``ui.engine``, ``ui.figures`` and
dllm_local's torch-free leaves."""
