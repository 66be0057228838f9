"""RFC 6962 / RFC 9162 Merkle-tree hashing, proofs and their verification, with no database.

leaf = SHA-256(0x00 ‖ entry), node = SHA-256(0x01 ‖ left ‖ right); the tree over n leaves
splits at k, the largest power of two below n (RFC 6962 §2.1). Proofs are built from a
`subtree(start, end)` callback giving the hash of leaves [start, end), so the caller decides
where hashes come from (stored nodes, or a list of leaves). Verification follows RFC 9162
§2.1.3.2 (inclusion) and §2.1.4.2 (consistency) and needs only the standard library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

Subtree = Callable[[int, int], bytes]


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split(n: int) -> int:
    """k: the largest power of two smaller than n (n ≥ 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) from leaf hashes, from scratch (the reference the stored tree must equal)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = split(len(leaves))
    return node_hash(root_of(leaves[:k]), root_of(leaves[k:]))


def inclusion_path(index: int, size: int, subtree: Subtree) -> list[bytes]:
    """PATH(m, D[n]) of RFC 6962 §2.1.1, leaf first."""

    def path(m: int, start: int, end: int) -> list[bytes]:
        if end - start == 1:
            return []
        k = split(end - start)
        if m - start < k:
            return path(m, start, start + k) + [subtree(start + k, end)]
        return path(m, start + k, end) + [subtree(start, start + k)]

    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    return path(index, 0, size)


def consistency_path(first: int, second: int, subtree: Subtree) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 6962 §2.1.2."""

    def subproof(m: int, start: int, end: int, complete: bool) -> list[bytes]:
        if m == end - start:
            return [] if complete else [subtree(start, end)]
        k = split(end - start)
        if m <= k:
            return subproof(m, start, start + k, complete) + [subtree(start + k, end)]
        return subproof(m - k, start + k, end, False) + [subtree(start, start + k)]

    if not 0 < first <= second:
        raise ValueError(f"no consistency proof from {first} to {second}")
    return [] if first == second else subproof(first, 0, second, True)


def verify_inclusion(
    leaf: bytes, index: int, size: int, path: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 §2.1.3.2: does `path` prove leaf `index` in the tree of `size` with `root`?"""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    first: int, second: int, path: Sequence[bytes], first_root: bytes, second_root: bytes
) -> bool:
    """RFC 9162 §2.1.4.2: is the tree of `second` an append-only extension of `first`?"""
    if not 0 < first <= second:
        return False
    if first == second:
        return not path and first_root == second_root
    proof = list(path)
    if first & (first - 1) == 0:  # a power of two: the old root is the first node
        proof = [first_root, *proof]
    if not proof:
        return False
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root


def proof_sizes(size: int) -> dict[str, int]:
    """Hashes in an inclusion proof of the last leaf and of the first, and in a consistency
    proof from size − 1 and from size / 2, in a tree of `size` (computed, no hashing)."""

    def dummy(start: int, end: int) -> bytes:
        return b""

    return {
        "inclusion_first_leaf": len(inclusion_path(0, size, dummy)),
        "inclusion_last_leaf": len(inclusion_path(size - 1, size, dummy)),
        "consistency_from_size_minus_1": len(consistency_path(size - 1, size, dummy)),
        "consistency_from_half": len(consistency_path(size // 2, size, dummy)),
    }
