"""Pieces of a GPU trial that need no GPU: the bitwise comparison of two runs' outputs."""

from __future__ import annotations

import numpy as np

from workers.trial import same_bits


def test_same_bits_compares_bytes_not_values():
    a = np.array([0.0, 1.5, np.nan], dtype=np.float32)
    assert same_bits(a, a.copy())
    assert not same_bits(a, np.array([-0.0, 1.5, np.nan], dtype=np.float32))  # equal values
    payload = a.copy()
    payload.view(np.uint32)[2] += 1  # another NaN
    assert not same_bits(a, payload)


def test_same_bits_on_word_and_odd_sizes():
    words = np.arange(64, dtype=np.uint16).reshape(4, 16)  # 128 bytes: compared as 8-byte words
    other = words.copy()
    assert same_bits(words, other)
    other[3, 15] ^= 1
    assert not same_bits(words, other)
    odd = np.arange(7, dtype=np.uint8)
    assert same_bits(odd, odd.copy()) and not same_bits(odd, odd[::-1].copy())
    assert not same_bits(odd, np.arange(8, dtype=np.uint8))
