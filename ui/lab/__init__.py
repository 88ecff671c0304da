"""A class on one page: who may run what (the lab's limits per user), the lecturer's Lab tab that
lists and stops anyone's requests. May import ``ui.parts``, ``ui.engine`` and dllm_local's torch-free
leaves."""
