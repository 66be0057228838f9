"""What the audit log knows: the hash-chained certificates and the lineage history read from
them (`certificates`), the Merkle tree and its signed heads (`transparency`, over `merkle`),
and the receipts a requester keeps (`receipts`). The worker and the preview read the same
functions here."""
