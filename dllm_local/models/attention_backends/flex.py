"""The ``flex`` backend: FlexAttention, the ``KeyRule`` as a ``mask_mod`` and its ``BlockMask``."""
from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .rule import KeyRule

# Off a GPU the unfused path is the one meant (the tests' exact reference; inductor on a CPU costs
# more than it gains here): its advice to compile is noise there. On CUDA the fused kernel runs,
# compiled on first use (eager, it would materialise every score); inside a compiled forward too.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
_FUSED = torch.compile(flex_attention)


class Flex:
    """``torch.nn.attention.flex_attention`` with the forward's rule as a ``mask_mod``: one
    request's queries over its valid keys as its layout allows; packed requests without padding,
    the ``N`` queries over every slot's keys flattened into one row (``[1, kv_heads, rows * keys,
    head_dim]``, a copy a layer), each attending only its own slot's; grouped K/V heads as they are
    (``enable_gqa``). The ``BlockMask`` is built once a forward and skips the blocks no query
    attends (another request's slot, a later block)."""

    def mask(self, rule: KeyRule) -> BlockMask:
        if not rule.layouts:  # the dense mask is the rule
            grid = rule.dense[0, 0].expand(rule.queries.numel(), -1)
            return _block_mask(lambda b, h, i, j: grid[i, j], rule.queries.numel(), grid.shape[-1], grid.device)
        allowed = _allowed(rule)
        queries, keys, n = rule.queries, rule.keys, rule.queries.numel()
        if rule.query_row is None:  # one request: every row (a fork's variants) attends alike
            live = None if rule.live is None else rule.live[0]

            def one(b, h, i, j):
                ok = allowed(queries[i], keys[j], 0)
                return ok if live is None else ok & live[j]
            return _block_mask(one, n, keys.numel(), keys.device)
        width, live, row_of = keys.numel(), rule.live.flatten(), rule.query_row

        def packed(b, h, i, j):  # key j of the flattened rows: row j // width, column j % width
            row = j // width
            return (row_of[i] == row) & live[j] & allowed(queries[i], keys[j % width], row)
        return _block_mask(packed, n, live.numel(), keys.device)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: BlockMask) -> torch.Tensor:
        kernel = _FUSED if q.is_cuda else flex_attention
        return kernel(q, keys.to(q.dtype), values.to(q.dtype), block_mask=mask, enable_gqa=keys.shape[1] != q.shape[1])

    def attend_packed(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rule: KeyRule,
                      mask: BlockMask) -> torch.Tensor:
        rows, kv_heads, width, dim = keys.shape
        flat = [t.transpose(0, 1).reshape(1, kv_heads, rows * width, dim) for t in (keys, values)]
        return self.attend(q, *flat, mask)


def _allowed(rule: KeyRule) -> Callable:
    """``(query position, key position, row) -> bool``: each row's layout, one test where all agree."""
    distinct = []
    for layout in rule.layouts:
        if layout not in distinct:
            distinct.append(layout)
    if len(distinct) == 1:
        return lambda q, k, row: distinct[0].allows(q, k)
    which = torch.tensor([distinct.index(layout) for layout in rule.layouts], device=rule.queries.device)

    def by_row(q, k, row):
        tests = [(which[row] == at) & layout.allows(q, k) for at, layout in enumerate(distinct)]
        return functools.reduce(torch.logical_or, tests)
    return by_row


def _block_mask(mask_mod: Callable, n: int, keys: int, device: torch.device) -> BlockMask:
    # B and H None: every batch row (a fork's variants) and every head attend alike.
    return create_block_mask(mask_mod, None, None, n, keys, device=device)
