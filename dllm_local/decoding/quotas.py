"""The cache budget of a batch, shared by its requests' adaptive caches as quotas."""
from __future__ import annotations

FLOOR_SHARE = 0.2  # the write-up's rule: every request keeps at least 20% of its length's K/V


class QuotaPool:
    """The cache budget of a batch, shared by its requests' adaptive caches (the I/O-aware
    write-up's per-request quotas): ``total`` positions, the sum of the requests' own budgets.

    After each forward the pool gives every request its floor first (``floors``: at least
    ``FLOOR_SHARE`` of its length, never more than its own budget), so a long request cannot
    take the memory of the others. The rest is split max-min fairly over what each holds beyond
    its floor: a request wanting less than an even share keeps what it holds, and what it leaves
    is split evenly among the others, and so on. So a request that needs more (a refresh fills
    its cache) takes what the others do not use, and a finished request's quota goes back to the
    pool. Each request then evicts by confidence, K and V together, down to its quota: the quotas
    never sum to more than the total.
    """

    def __init__(self, total: int) -> None:
        self.total = int(total)

    def allocate(self, holding: dict[int, int], floors: dict[int, int] | None = None) -> dict[int, int]:
        """Each request's quota, from the positions it holds now and its floor."""
        floors = {i: (floors or {}).get(i, 0) for i in holding}
        quotas = dict(floors)
        left = self.total - sum(floors.values())
        wants = {i: max(0, holding[i] - floors[i]) for i in holding}
        waiting = sorted(wants, key=wants.get)
        while waiting and wants[waiting[0]] <= left // len(waiting):
            request = waiting.pop(0)
            quotas[request] += wants[request]
            left -= wants[request]
        for k, request in enumerate(waiting):  # the rest share what is left evenly
            quotas[request] += left // len(waiting) + (1 if k < left % len(waiting) else 0)
        return quotas
