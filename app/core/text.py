"""Text corpora as word counts (seed 000): tokenisation and vocabulary fixed at registration,
rare words merged into one token (Assumption 3), and the paper's generative model as a
synthetic corpus with known anchor words, A* and R*.

A document is stored as its count vector over the fixed vocabulary, so a deletion subtracts
exactly what was counted. Numpy only: the HTTP layer and the workers share it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.core.errors import unprocessable

RARE = "<rare>"
TOKEN = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)
MAX_VOCABULARY = 20_000


def tokenize(text: str) -> list[str]:
    """Lower-cased runs of letters (an apostrophe inside a word is kept): the one tokeniser."""
    return TOKEN.findall(text.lower())


@dataclass(frozen=True)
class Corpus:
    """Documents as counts over `vocabulary` (the last entry is the rare token when any word
    was merged), and how many documents have fewer than two tokens (they count for nothing
    in the co-occurrence statistic: L(L − 1) = 0)."""

    counts: np.ndarray  # float32 (documents × vocabulary)
    vocabulary: list[str]
    short_documents: int

    def meta(self, min_count: int) -> dict[str, object]:
        return {
            "words": self.vocabulary,
            "rare_token": RARE if RARE in self.vocabulary else None,
            "min_count": min_count,
            "documents_under_two_tokens": self.short_documents,
        }


def count_documents(
    texts: list[str], min_count: int, check_size: Callable[[int, int], None] | None = None
) -> Corpus:
    """Tokenise, keep the words seen at least `min_count` times in the corpus (at most
    MAX_VOCABULARY of them, most frequent first), merge the rest into `<rare>`.

    Two streaming passes, no token lists kept: the first counts the words, then
    `check_size(documents, vocabulary)` may refuse before the documents × vocabulary matrix
    is allocated (an 8 MB file with a million distinct words took +3.5 GB before
    its 413); the second fills it."""
    frequency: Counter[str] = Counter()
    for t in texts:
        frequency.update(tokenize(t))
    kept = [w for w, c in frequency.most_common(MAX_VOCABULARY) if c >= min_count]
    rare = len(kept) < len(frequency)
    del frequency
    vocabulary = sorted(kept) + ([RARE] if rare else [])
    if check_size is not None:
        check_size(len(texts), len(vocabulary))
    index = {w: i for i, w in enumerate(vocabulary)}
    counts = np.zeros((len(texts), len(vocabulary)), dtype=np.float32)
    for d, t in enumerate(texts):
        for w in tokenize(t):
            counts[d, index.get(w, len(vocabulary) - 1)] += 1
    check_corpus(counts)
    return Corpus(counts, vocabulary, int((counts.sum(1) < 2).sum()))


def check_corpus(counts: np.ndarray) -> None:
    """422 for what no topic model can learn from: no documents, no words, negative or
    fractional counts, or fewer than two words in the vocabulary."""
    if counts.shape[0] == 0 or counts.sum() == 0:
        raise unprocessable("empty_corpus", "the corpus has no words")
    if counts.shape[1] < 2:
        raise unprocessable("vocabulary_too_small", "the vocabulary has fewer than two words")
    if (counts < 0).any():
        raise unprocessable("negative_counts", "a document-term matrix cannot hold negative counts")
    if not np.array_equal(counts, np.round(counts)):
        raise unprocessable("fractional_counts", "document-term counts must be whole numbers")


@dataclass(frozen=True)
class SyntheticCorpus:
    """A corpus drawn from seed 000's generative model, with its ground truth."""

    counts: np.ndarray  # documents × vocabulary
    A: np.ndarray  # vocabulary × topics, columns on the simplex
    R: np.ndarray  # topics × topics, E[W Wᵀ] of the Dirichlet mixtures
    anchors: list[int]  # the anchor word of each topic
    labels: np.ndarray  # each document's dominant topic (a topic-classification task)


def synthetic_corpus(
    vocabulary: int,
    topics: int,
    documents: int,
    length: int,
    separability: float,
    seed: int,
    concentration: float = 0.3,
) -> SyntheticCorpus:
    """Seed 000 §A.1: A* with one anchor word per topic carrying mass `separability` (p) and
    zero elsewhere, the other words Dirichlet(1)-distributed; each document draws its topic
    mixture W ~ Dirichlet(concentration) and `length` words i.i.d. from A* W."""
    if topics >= vocabulary:
        raise unprocessable(
            "vocabulary_too_small",
            f"{topics} topics need more than {topics} words (one anchor word each)",
        )
    rng = np.random.default_rng(seed)
    A = np.zeros((vocabulary, topics))
    anchors = list(range(topics))
    rest = rng.dirichlet(np.ones(vocabulary - topics), size=topics).T  # (n − r) × r
    A[topics:] = rest * (1.0 - separability)
    A[anchors, anchors] = separability
    alpha = np.full(topics, concentration)
    W = rng.dirichlet(alpha, size=documents)  # documents × topics
    R = (np.diag(alpha) + np.outer(alpha, alpha)) / (alpha.sum() * (alpha.sum() + 1))
    word_probabilities = W @ A.T  # documents × vocabulary
    counts = np.stack([rng.multinomial(length, p / p.sum()) for p in word_probabilities])
    labels = W.argmax(1).astype(np.int64)
    return SyntheticCorpus(counts.astype(np.float32), A, R, anchors, labels)
