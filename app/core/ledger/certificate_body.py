"""The body of a deletion's certificate as the log keeps and signs it: one versioned pydantic
model, whose JSON Schema the API serves at `/v1/schemas/certificate.json`
(docs/auditing.md reads it field by field). A method adds facts of its own (`extra`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.jsontypes import JsonObject

SCHEMA_VERSION: Literal[1] = 1
SCHEMA_PATH = "/v1/schemas/certificate.json"


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Sealed(Part):
    """A value shown only to auditors: a salted sha256 commitment to it stands here."""

    disclosed_to: str
    """who is given the value and the salt that opens the commitment"""
    commitment: str
    """sha256 of the salt and the canonical JSON of the value"""


class Constant(Part):
    """A number the certificate relies on, and whether it was measured or declared."""

    value: float | None
    """its value (null where it is disclosed to auditors only)"""
    source: Literal["measured", "declared"]
    """measured on the data, or declared by the method's options"""
    meaning: str
    """what it is"""
    public: str | None = None
    """what the decision needed of a sealed value, in words"""
    disclosed_to: str | None = None
    """who may see a sealed value"""
    commitment: str | None = None
    """the sealed value's commitment"""


class AccountantVersions(Part):
    dp_accounting: str = Field(alias="dp-accounting")
    """the dp-accounting release that computed ε and δ"""
    lineage: str | None
    """the lineage accountant (null: no noisy release was counted)"""


class Lineage(Part):
    """The model's noisy releases since its last exact retrain, and their budget."""

    releases_since_reset: int
    budget_epsilon: float
    budget_delta: float


class Target(Part):
    """The (ε, δ) the release had to meet."""

    epsilon: float
    delta: float


class DeletionCertificate(BaseModel):
    """What a deletion's certificate states: the versions, the method, the guarantee, ε and δ,
    every constant, the lineage, and a commitment to the removed ids. The log adds `seq`,
    `prev_hash` and `created_at` when it appends it."""

    model_config = ConfigDict(
        extra="allow", use_attribute_docstrings=True, populate_by_name=True, title="Certificate"
    )

    schema_version: Literal[1] = SCHEMA_VERSION
    """the version of this schema"""
    request_id: int | None
    """the deletion request it answers"""
    model_id: int
    from_version: int
    """the version the rows were removed from"""
    to_version: int
    """the version released without them"""
    method: str
    """the method that made the release (retrain where it fell back)"""
    method_chosen_by: str | None = None
    """why the model has its method, where Lethe chose it (`auto`)"""
    guarantee: Literal["exact", "rigorous", "conditional", "none"]
    """exact (ε = δ = 0), rigorous, conditional (on declared constants) or none (a heuristic)"""
    epsilon: float | None
    """the release's ε (null: a heuristic claims none)"""
    delta: float | None
    sigma: float
    """the Gaussian noise's standard deviation"""
    sensitivity: float
    """the Δ σ was calibrated on"""
    accountant: str
    accountant_versions: AccountantVersions
    constants: dict[str, Constant]
    cumulative_epsilon: float | None
    """the lineage's ε after this release (null for a heuristic)"""
    cumulative_delta: float | None
    lineage: Lineage
    lineage_reset: bool
    """whether this release starts the lineage anew (an exact retrain)"""
    lineage_event: JsonObject | None
    """the noisy release as the lineage counts it"""
    fallback_reason: str | None
    """why the exact retrain was used instead of the method"""
    publish_after_seconds: float | None = None
    """constant-time publication: the release was published no earlier than this many
    seconds after the newest request it serves was accepted (absent: as soon as ready)"""
    target: Target
    n_removed: int
    """rows this request removed"""
    removed_ids_commitment: str
    commitment_scheme: str
    release_sha256: str
    """sha256 of the released weights"""
    compares: str
    """what ε and δ compare"""
    sentence: str
    """the certificate in words"""
    coalesced_requests: Sealed
    """the requests one update served together (their ids: auditors only)"""
    n_removed_in_update: Sealed
    branch: Sealed | None = None
    """which branch ran, where that depends on the removed rows (auditors only)"""

    def body(self) -> JsonObject:
        """The JSON the log signs: every field set, a method's own facts included."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def certificate_schema(base_url: str = "") -> JsonObject:
    """The JSON Schema of a certificate's body (draft 2020-12, pydantic's)."""
    schema = DeletionCertificate.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{base_url}{SCHEMA_PATH}",
        **schema,
    }
