"""dllm-local playground: ``python app.py`` (the page arrives with the UI issue)."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

if __name__ == "__main__":
    print("dllm-local: the playground page will be served on http://127.0.0.1:7860 ;"
          " for now use `python -m dllm_local` or `import dllm_local`.")
