"""correlation_terms: the study-contract terms (max leakage and provenance) of a Gaussian correlation model."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from he_partition.methods.bayesian import adjacency_digest, correlation_terms, max_leakage


def test_correlation_terms_match_the_model() -> None:
    w = np.array([[0, 1, 0], [1, 0, 2], [0, 2, 0]], dtype=np.float64)
    terms = correlation_terms(w, 0.5, source_label="file=g.csv")
    assert terms["correlation_leakage"] == max_leakage(w, 0.5)
    digest = hashlib.sha256(w.astype("<f8").tobytes()).hexdigest()
    assert adjacency_digest(w) == digest
    assert terms["correlation_source"] == f"file=g.csv w_sha256={digest} tau=0.5 n=3"
    # tau = 0 on a connected graph: 1 + L = n for every record (seed 003, eq. (29)).
    assert correlation_terms(w, 0.0)["correlation_leakage"] == pytest.approx(2.0, rel=1e-12)
    with pytest.raises(ValueError, match="connected"):
        correlation_terms(np.zeros((2, 2)), 0.0)
    with pytest.raises(ValueError, match="source_label"):
        correlation_terms(w, 0.5, source_label="a\nb")
    assert len(correlation_terms(w, 0.5, source_label="x" * 256)["correlation_source"]) <= 512  # fits a contract
