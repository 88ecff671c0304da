"""The dllm-local playground page: torch-free, built only from recorded traces."""
