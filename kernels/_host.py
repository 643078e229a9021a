"""Host-side integer helpers for the kernel launchers (plain Python: ``triton.cdiv`` / ``triton.next_power_of_2``
are constexpr-function wrappers in recent Triton, ~5 us per call, and a launch path calls them dozens of times)."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1
