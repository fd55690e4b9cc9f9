"""How batches are shaped so that few distinct shapes reach the compiler:
sizes rounded up (to a multiple, to a power of two), and long sentences cut
into overlapping windows of a bounded length."""
from __future__ import annotations


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def next_power_of_two(n: int, smallest: int = 8) -> int:
    """The next power of two >= n (at least `smallest`)."""
    b = smallest
    while b < n:
        b *= 2
    return b


def windows(n: int, max_length: int) -> list[tuple[int, int, int, int]]:
    """[(start, end, keep_start, keep_end)]: windows of at most `max_length`
    of n tokens, overlapping by a quarter of it; token i is kept from the
    window where it is furthest from an edge (the cuts halve the overlaps).
    One window (0, n, 0, n) when n <= max_length."""
    if n <= max_length:
        return [(0, n, 0, n)]
    overlap = max_length // 4
    stride = max_length - overlap
    starts = list(range(0, n - max_length, stride)) + [n - max_length]
    spans = [(a, a + max_length) for a in starts]
    cuts = [0] + [(spans[k + 1][0] + spans[k][1]) // 2 for k in range(len(spans) - 1)] + [n]
    return [(a, b, cuts[k], cuts[k + 1]) for k, (a, b) in enumerate(spans)]
