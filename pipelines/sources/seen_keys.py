"""Which keys a long stream has shown so far, in 16 bytes per key (a file's externalIds).

A Python set of the keys themselves costs ~180 bytes per key: 180 MB for a million-row file.
Here a key is its 128-bit BLAKE2b digest (a collision among 10^9 keys has probability ~10^-21:
the trust content addressing puts in sha256), split in two 64-bit halves and kept in sorted NumPy
arrays whose sizes halve from the first to the last (a log-structured merge). A million keys
take 16 MB, and a batch is checked with one vectorized binary search per array.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np

EMPTY_DIGEST = hashlib.blake2b(digest_size=16)  # only ever copied


def digest_of(text: str) -> bytes:
    return digests_of([text.encode()])[0]


def digests_of(
    utf8_texts: Iterable[bytes | memoryview], groups: Iterable[int] | None = None
) -> list[bytes]:
    """digest_of of each text, given as UTF-8 (say, slices of an Arrow string array). Each
    starts as a copy of one empty hash: a fifth cheaper than a new one, with its parameters.
    With `groups`, a text's key is its group's (a file's) and its own: the group, in a fixed
    8 bytes so that no text of one group reads as another's, then the text."""
    starts: Iterator[Any]
    if groups is None:
        starts = repeat(EMPTY_DIGEST)
    else:
        heads: dict[int, Any] = {}
        for group in set(groups := list(groups)):
            heads[group] = EMPTY_DIGEST.copy()
            heads[group].update(group.to_bytes(8, "little"))
        starts = map(heads.__getitem__, groups)
    digests = []
    for text, start in zip(utf8_texts, starts, strict=False):
        digest = start.copy()
        digest.update(text)
        digests.append(digest.digest())
    return digests


class SeenKeys:
    def __init__(self) -> None:
        # (high halves sorted, low halves in the same order); sizes decreasing
        self.levels: list[tuple[np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return sum(len(high) for high, _ in self.levels)

    def first_times(self, texts: Sequence[str]) -> np.ndarray:
        """For each text, in order: True when no earlier text, of this call or an earlier one,
        was equal to it. Remembers them all."""
        return self.first_times_of_digests([digest_of(t) for t in texts])

    def first_times_of_digests(self, digests: Sequence[bytes]) -> np.ndarray:
        first = np.ones(len(digests), dtype=bool)
        if len(set(digests)) < len(digests):  # a key repeated within the call
            in_call: set[bytes] = set()
            for i, digest in enumerate(digests):
                if digest in in_call:
                    first[i] = False
                in_call.add(digest)
        if not len(digests):
            return first
        halves = np.frombuffer(b"".join(digests), dtype=np.uint64).reshape(-1, 2)
        high, low = halves[:, 0], halves[:, 1]
        for level_high, level_low in self.levels:
            at = _searchsorted(level_high, high)
            found = np.flatnonzero(at < len(level_high))
            found = found[level_high[at[found]] == high[found]]
            for i in found:  # a 64-bit match: rare (a repeat, or one in ~10^19 pairs)
                j = at[i]
                while j < len(level_high) and level_high[j] == high[i]:
                    if level_low[j] == low[i]:
                        first[i] = False
                    j += 1
        self.add(high[first], low[first])
        return first

    def add_digests(self, digests: bytes) -> None:
        """Remember keys given as their digests, concatenated (known to be new)."""
        halves = np.frombuffer(digests, dtype=np.uint64).reshape(-1, 2)
        self.add(halves[:, 0], halves[:, 1])

    def add(self, high: np.ndarray, low: np.ndarray) -> None:
        if not len(high):
            return
        order = np.argsort(high, kind="stable")
        self.levels.append((high[order], low[order]))
        while len(self.levels) > 1 and len(self.levels[-1][0]) >= len(self.levels[-2][0]):
            (new_high, new_low), (old_high, old_low) = self.levels.pop(), self.levels.pop()
            high_all = np.concatenate([old_high, new_high])
            order = np.argsort(high_all, kind="stable")
            self.levels.append((high_all[order], np.concatenate([old_low, new_low])[order]))


def _searchsorted(haystack: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """np.searchsorted, with the needles sorted first: a search that walks the haystack in
    order touches memory in order, several times faster on a large haystack than random ones."""
    order = np.argsort(needles)
    at = np.empty(len(needles), dtype=np.intp)
    at[order] = np.searchsorted(haystack, needles[order])
    return at
