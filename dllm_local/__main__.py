"""``python -m dllm_local``: the command line (``dllm_local.cli``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
