"""Sizes rounded up, so that few distinct shapes reach the compiler."""
from __future__ import annotations


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def bucket(n: int, smallest: int = 8) -> int:
    """The next power of two >= n (at least `smallest`)."""
    b = smallest
    while b < n:
        b *= 2
    return b
