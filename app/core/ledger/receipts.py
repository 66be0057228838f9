"""Checking a receipt offline: from files alone, with no server and no database,
a data subject or an auditor checks that a certificate was logged under a signed head, and
later that a newer head extends that one (the log was never rewritten)."""

from __future__ import annotations

import base64
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app.core.ledger import merkle
from app.core.ledger.transparency import head_message


class ReceiptError(ValueError):
    """A receipt, head or proof that does not hold; the message says which check failed."""


def verify_head(head: dict[str, Any], keys: dict[str, Any]) -> None:
    """The head's Ed25519 signature under the key it names; unknown keys are refused."""
    known = {k["key_id"]: k["public_key"] for k in keys["keys"]}
    if head["key_id"] not in known:
        raise ReceiptError(f"head of size {head['tree_size']} is signed by an unknown key")
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(known[head["key_id"]]))
    message = head_message(head["tree_size"], head["root_hash"], head["timestamp"])
    try:
        public.verify(base64.b64decode(head["signature"]), message)
    except InvalidSignature as exc:
        raise ReceiptError(f"head of size {head['tree_size']}: bad signature") from exc


def verify_receipt(receipt: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """The entry hashes to the leaf, the leaf is in the signed head's tree. Returns the head."""
    head = receipt["tree_head"]
    if head is None or head["tree_size"] != receipt["tree_size"]:
        raise ReceiptError("the receipt carries no signed head at its tree size")
    verify_head(head, keys)
    leaf = merkle.leaf_hash(receipt["entry"].encode())
    if leaf.hex() != receipt["leaf_hash"]:
        raise ReceiptError("the certificate does not hash to the receipt's leaf")
    path = [bytes.fromhex(h) for h in receipt["inclusion_path"]]
    root = bytes.fromhex(head["root_hash"])
    if not merkle.verify_inclusion(leaf, receipt["leaf_index"], head["tree_size"], path, root):
        raise ReceiptError("the inclusion proof does not lead to the signed root")
    return dict(head)


def verify_extension(
    old: dict[str, Any], new: dict[str, Any], proof: dict[str, Any], keys: dict[str, Any]
) -> None:
    """The newer signed head's tree is an append-only extension of the older one's."""
    verify_head(new, keys)
    if proof["first"] != old["tree_size"] or proof["second"] != new["tree_size"]:
        raise ReceiptError("the consistency proof is for other tree sizes")
    path = [bytes.fromhex(h) for h in proof["consistency_path"]]
    if not merkle.verify_consistency(
        old["tree_size"],
        new["tree_size"],
        path,
        bytes.fromhex(old["root_hash"]),
        bytes.fromhex(new["root_hash"]),
    ):
        raise ReceiptError(
            f"the consistency proof does not show that the log of size {new['tree_size']} "
            f"extends the one of size {old['tree_size']}: the proof is corrupt or the log was "
            "rewritten (fetch the proof again; if a fresh proof fails too, the log forked)"
        )
