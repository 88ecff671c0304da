"""What a canvas model's decoder did in a pass, read by forward hooks on transformers' modules:
each layer's K and V of the canvas (their drift from the pass before) and the experts its router
chose. The model is only watched, never changed."""
from __future__ import annotations

import torch


def _cosines(now: torch.Tensor, before: torch.Tensor) -> list[float]:
    """Per canvas position, the cosine of its K (or V) over all heads with the pass before's."""
    a, b = now.flatten(1).float(), before.flatten(1).float()
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).tolist()


class DecoderWatch:
    """Hooks on each decoder layer's K and V norms (RoPE then turns a position's K alike in two
    passes, so the cosine is the rotated K's too) and on its router (``output[2]``: the experts
    each token was sent to). A hook only keeps a reference to the tensor, which the model never
    changes after: what is read from it is read after the pass is timed (``kv_record``,
    ``experts_record``), so the watching costs the model's time nothing. ``keep_kv``: K and V
    are kept only for a trace that records them."""

    def __init__(self, decoder: torch.nn.Module, keep_kv: bool = True) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.routed: dict[int, torch.Tensor] = {}
        self.previous: tuple[dict, dict] | None = None
        self.hooks = []
        for i, layer in enumerate(decoder.layers):
            if keep_kv:
                self.hooks.append(layer.self_attn.k_norm.register_forward_hook(self._keep(self.k, i)))
                self.hooks.append(layer.self_attn.v_norm.register_forward_hook(self._keep(self.v, i)))
            self.hooks.append(layer.router.register_forward_hook(self._keep(self.routed, i, part=2)))

    @staticmethod
    def _keep(store: dict, layer: int, part: int | None = None):
        def hook(module, args, output) -> None:
            store[layer] = output if part is None else output[part]  # K, V: [batch, canvas, heads, head_dim]
        return hook

    def new_canvas(self) -> None:
        """A canvas's first pass has no pass before it to drift from."""
        self.previous = None

    def experts_record(self) -> dict[str, list[int]]:
        """Per layer, the distinct experts its router chose in the last pass."""
        return {str(layer): torch.unique(chosen).tolist() for layer, chosen in sorted(self.routed.items())}

    def kv_record(self, start: int, canvas_length: int, total: int, level: str) -> dict | None:
        """Per layer, the canvas's K and V cosine with the pass before's, in a list over the whole
        sequence: null before the canvas (the encoder's cache, which the decoder only reads: exact
        by construction, drawn so from the canvas's start, not stored), on a canvas's first pass
        (none before it) and past the canvas.
        ``level`` summary: their mean and minimum over the canvas, as the recorder's summary."""
        if level == "off":
            return None
        now = (dict(self.k), dict(self.v))
        before, self.previous = self.previous, now
        record = {}
        for layer in sorted(now[0]):
            row = {}
            for i, name in enumerate(("k", "v")):
                canvas = ([None] * canvas_length if before is None
                          else [round(c, 5) for c in _cosines(now[i][layer][0], before[i][layer][0])])
                if level == "summary":
                    values = [c for c in canvas if c is not None]
                    row[f"{name}_mean"] = round(sum(values) / len(values), 6) if values else None
                    row[f"{name}_min"] = round(min(values), 6) if values else None
                else:
                    row[name] = [None] * start + canvas + [None] * (total - start - canvas_length)
            record[str(layer)] = row
        return record

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


class KeepScores:
    """The last of generate's logits processors: it keeps the processed scores (what the sampler
    and the stopping rule read, in float32), changes nothing and draws no random number."""

    scores: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.scores = scores
        return scores
