"""The typed configuration of a model: architecture, training, privacy policy.

Stored as JSON on the model row; parsed back into these types wherever code reads them, so no
layer indexes an untyped dict. Pydantic only: the API, the workers and the benches share them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from lethe_client.jsontypes import JsonObject


class Strict(BaseModel):
    """No unknown keys, no NaN/∞, and no type coercion (`"20"` or `true` is not an integer),
    as the OpenAPI schema says."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
    )


class LogRegSpec(Strict):
    """A linear classifier (logistic regression) on the features."""

    type: Literal["logreg"]
    """logreg"""
    feature_norm: float | None = Field(
        None,
        gt=1.0,
        le=1e6,
        description="R: inputs are scaled so that ‖(x, 1)‖ ≤ R (the bias coordinate inside the "
        "bound), in training and inference alike; set by the convex_head method",
    )


class MLPSpec(Strict):
    """A multilayer perceptron: linear layers with one activation between them."""

    type: Literal["mlp"]
    """mlp"""
    hidden: list[Annotated[int, Field(ge=1, le=4096)]] = Field([64, 64], min_length=1, max_length=8)
    """hidden layer widths"""
    activation: Literal["relu", "tanh", "gelu", "sigmoid"] = "relu"
    """activation between layers"""


class RandomFeaturesSpec(Strict):
    """A linear model on random features φ(x) = act(A x + b): A and b are frozen, drawn from
    `seed` (A ~ N(0, scale²/d), b ~ N(0, bias_scale²)), so only the last layer is trained
    (seed 001's two-layer setting with A fixed, which is linear in the trained layer). A large
    bias makes ReLU units always on or off, hence linear in x: the features then span little
    more than the inputs (on digits, b ~ N(0, 1) left rank 900 of 1,437)."""

    type: Literal["random_features"]
    """random_features"""
    width: int = Field(2048, ge=1, le=65536, description="h: the number of random features")
    activation: Literal["relu", "tanh", "cos"] = Field("relu", description="the activation act")
    scale: float = Field(1.0, gt=0.0, le=1e3, description="scale of the frozen weights A")
    bias_scale: float = Field(0.1, ge=0.0, le=1e3, description="scale of the frozen bias b")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the frozen first layer")


class TopicModelSpec(Strict):
    """A topic model on a text corpus (seed 000): the word–topic matrix A (vocabulary ×
    topics, columns on the simplex) and the topic covariance R, learned by the anchor-word
    algorithm (Arora et al. 2012). Not a classifier: it has no accuracy."""

    type: Literal["topic_model"]
    """topic_model"""
    topics: int = Field(20, ge=2, le=500, description="r: the number of topics")
    projection_dim: int | None = Field(
        None,
        ge=2,
        le=10_000,
        description="random-projection dimension for anchor finding (default: the vocabulary, "
        "capped at 1,000)",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the random projection")


class TopicHeadSpec(Strict):
    """A classifier on a topic model (seed 000 §A.6): a logistic head w on topic features
    n·x̄ᵀA_S (x̄ the document's word frequencies, n the vocabulary size), served as
    B = n·A_S w (vocabulary × classes) plus a bias: logits x̄ᵀB + bias. `base_model` names
    an `anchor_topics` model on the same corpus; its topics, projection and seed are copied
    at creation, and the head learns A_S as that model does (Algorithm 6: 𝒜_base(S), then
    the head)."""

    type: Literal["topic_head"]
    """topic_head"""
    base_model: int = Field(ge=1, le=2**53 - 1, description="an anchor_topics model")
    topics: int = Field(20, ge=2, le=500, description="copied from the base model")
    projection_dim: int | None = Field(None, ge=2, le=10_000, description="copied from it")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="copied from the base model")


ArchitectureSpec = LogRegSpec | MLPSpec | RandomFeaturesSpec | TopicModelSpec | TopicHeadSpec
Architecture = Annotated[ArchitectureSpec, Field(discriminator="type")]
_ARCHITECTURE: TypeAdapter[ArchitectureSpec] = TypeAdapter(Architecture)


class TrainingConfig(Strict):
    """Seeded minibatch SGD: the same configuration and seed retrain exactly."""

    epochs: int = Field(20, ge=1, le=1000)
    """passes over the data"""
    batch_size: int = Field(64, ge=1, le=65536)
    """samples per step"""
    learning_rate: float = Field(0.1, gt=0.0, le=10.0)
    """SGD step size"""
    weight_decay: float = Field(1e-4, ge=0.0, le=1.0)
    """L2 weight decay"""
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    """SGD momentum"""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """initialisation and batch order"""


class ImportedWeights(Strict):
    """Where an imported model's uploaded weights wait until its first version is written."""

    blob: str
    """the blob holding them"""
    sha256: str
    """their sha256"""


class StoredTraining(TrainingConfig):
    """A model's training configuration as its row holds it: for an imported model, where
    its uploaded weights wait until the first version is written."""

    imported: ImportedWeights | None = None
    """an imported model's uploaded weights, until its first version is written"""

    def config(self) -> TrainingConfig:
        """The configuration alone (what training and a retrain use)."""
        return TrainingConfig.model_validate(self.model_dump(exclude={"imported"}))


class StoredMethod(BaseModel):
    """A model's unlearning method as its row holds it: the name, and the options the method's
    spec validated at creation (`methods.method_of` types them again where they are used)."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    name: str = "retrain"
    """the method"""
    chosen_by: str | None = None
    """why Lethe chose this method, where the model asked for `auto`"""


class PrivacyPolicy(Strict):
    """What each release must meet and how much the lineage may spend."""

    epsilon: float = Field(1.0, gt=0.0, le=100.0, description="per-release target ε")
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="per-release target δ")
    lineage_epsilon: float = Field(10.0, gt=0.0, le=1000.0)
    """ε budget of all noisy releases since the last exact retrain"""
    lineage_delta: float = Field(1e-4, gt=0.0, lt=1.0)
    """δ budget of all noisy releases since the last exact retrain"""
    allow_heuristic: bool = False
    """let a method without a guarantee (minnorm_og) run"""
    max_relative_noise: float | None = Field(0.5, gt=0.0, le=1000.0)
    """the utility floor: a noisy release whose planned noise (σ·√d over its d noised
    parameters) exceeds this share of the norm of the model's last noise-free version is
    replaced by the exact retrain, for a public reason (null: no floor)"""
    publish_after_seconds: float | None = Field(None, gt=0.0, le=86_400.0)
    """constant-time publication: an update is published no earlier than this many seconds
    after the newest request it serves was accepted, so a requester's clock does not tell
    which branch ran (null: published as soon as it is ready)"""


def architecture_of(spec: ArchitectureSpec | JsonObject) -> ArchitectureSpec:
    """A typed architecture from its stored JSON (typed values pass through)."""
    if isinstance(spec, LogRegSpec | MLPSpec | RandomFeaturesSpec | TopicModelSpec | TopicHeadSpec):
        return spec
    return _ARCHITECTURE.validate_python(spec)


def training_of(config: TrainingConfig | JsonObject) -> TrainingConfig:
    """A typed training configuration from JSON a test or a bench writes down."""
    if isinstance(config, StoredTraining):
        return config.config()
    if isinstance(config, TrainingConfig):
        return config
    return TrainingConfig.model_validate(config)
