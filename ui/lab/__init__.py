"""A class on one page: who may run what (the lab's limits per user), the lecturer's Lab tab that lists
and stops anyone's requests. May import no other folder of ``ui``: dllm_local's torch-free leaves,
gradio and plotly; never torch."""
