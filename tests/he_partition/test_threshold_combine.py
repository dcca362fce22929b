"""Combine-time checks of threshold decryption (docs/threshold.md section 3 step 3).

No holder can measure a noise budget alone, so the combiner checks the combined value: a share
made with the wrong secret, relabelled as another holder's, at another level, or a ciphertext
not under the collective key is refused with a ShareCombineError naming the problem, never
decoded to garbage.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tenseal.sealapi as seal

from he_partition.core.errors import ShareCombineError
from he_partition.he.seal_io import seal_bytes
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.keys import encrypt_sum, load_seal
from he_partition.he.threshold.wire import DecryptionShare

from .test_threshold import HOLDERS, make_setup


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    return make_setup()


def _ct(s: dict[str, Any], seed: int) -> tuple[bytes, list[int]]:
    row = np.random.default_rng(seed).integers(0, 1 << 30, 8192).tolist()
    return encrypt_sum(s["ctx"], s["pk"], [row]), row


def _shares(s: dict[str, Any], ct: bytes) -> list[bytes]:
    return [decryption_share(s["ctx"], s["secrets"][h], s["fp"], ct) for h in HOLDERS]


def test_honest_shares_combine_with_margin_to_spare(setup: dict[str, Any]) -> None:
    ct, row = _ct(setup, 1)
    assert combine(setup["ctx"], ct, _shares(setup, ct), HOLDERS, setup["fp"]).tolist() == row
    # the margin the check relies on: an honest K = 3 combine keeps well over the 20-bit floor
    with pytest.raises(ShareCombineError, match=r"has \d+ bits of noise budget \(< 60\)"):
        combine(setup["ctx"], ct, _shares(setup, ct), HOLDERS, setup["fp"], min_budget=60)


def test_a_share_relabelled_as_another_holders_is_refused_not_decoded(setup: dict[str, Any]) -> None:
    """Holder 0's share sent twice, once relabelled as holder 1 (holder 1 never issued one): every wire check
    passes (right ciphertext, key, distinct labels), only the combined value's noise budget shows it."""
    ct, _ = _ct(setup, 2)
    shares = _shares(setup, ct)
    own = DecryptionShare.from_bytes(shares[0])
    shares[1] = DecryptionShare(1, own.key_fingerprint, own.ciphertext_digest, own.payload).to_bytes()
    with pytest.raises(ShareCombineError, match="0 bits of noise budget .* another secret or for another holder"):
        combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])


def test_a_ciphertext_not_under_the_collective_key_is_refused(setup: dict[str, Any]) -> None:
    other = make_setup()  # same parameters, another collective key
    ct, _ = _ct(other, 3)
    with pytest.raises(ShareCombineError, match="noise budget"):
        combine(setup["ctx"], ct, _shares(setup, ct), HOLDERS, setup["fp"])


def test_a_share_at_another_level_or_unreduced_is_refused_with_the_problem_named(setup: dict[str, Any]) -> None:
    ctx = setup["ctx"]
    ct, _ = _ct(setup, 4)
    low = load_seal(seal.Ciphertext, ctx, ct, "ciphertext")
    seal.Evaluator(ctx.seal_context().data).mod_switch_to_next_inplace(low)
    low_bytes = seal_bytes(low)
    low_share = DecryptionShare.from_bytes(decryption_share(ctx, setup["secrets"][1], setup["fp"], low_bytes))
    shares = _shares(setup, ct)
    mine = DecryptionShare.from_bytes(shares[1])
    shares[1] = DecryptionShare(1, mine.key_fingerprint, mine.ciphertext_digest, low_share.payload).to_bytes()
    with pytest.raises(ShareCombineError, match=r"holder 1 .* \(a share at a level with 2 primes\), expected .* 3 primes"):
        combine(ctx, ct, shares, HOLDERS, setup["fp"])
    shares = _shares(setup, ct)
    raw = bytearray(shares[2])
    raw[-8:] = (2 ** 64 - 1).to_bytes(8, "little")
    with pytest.raises(ShareCombineError, match="holder 2 is not reduced"):
        combine(ctx, ct, [shares[0], shares[1], bytes(raw)], HOLDERS, setup["fp"])
    # the share of the lower-level ciphertext, as it came from the holder, is bound to that ciphertext
    with pytest.raises(ShareCombineError, match="holder 1 is for another ciphertext"):
        combine(ctx, ct, [_shares(setup, ct)[0], low_share.to_bytes(), _shares(setup, ct)[2]], HOLDERS, setup["fp"])


def test_combine_refusals_are_value_errors_with_the_holder_named(setup: dict[str, Any]) -> None:
    ct, _ = _ct(setup, 5)
    shares = _shares(setup, ct)
    with pytest.raises(ValueError, match="missing decryption share from holder 2"):
        combine(setup["ctx"], ct, shares[:2], HOLDERS, setup["fp"])
    with pytest.raises(ShareCombineError, match="under another collective key"):
        combine(setup["ctx"], ct, shares, HOLDERS, bytes(32))


def test_the_combined_noise_polynomial_does_not_carry_the_holders_noise_plaintexts(setup: dict[str, Any]) -> None:
    """Without smudging (B = 1), the combined view's noise polynomial is the encryptions' small noise, with or
    without the holders' DP shares and pads: each holder scales its noise plaintext as SEAL does, round(Q m / t),
    so nothing of the size of (Q mod t) m / t (2^47.6 here, a function of the holders' secret noise that only
    the smudging would hide) is left in it."""
    from he_partition.core.measurements import PartitionSums

    from .threshold_attacker import ThresholdScenario, decode, residual

    x = np.random.default_rng(3).poisson(20, 8192).astype(np.int64)
    m = PartitionSums(8192, 0.05, 1, tuple(range(0, 8192, 128)))
    sizes = {}
    for dp in (False, True):
        scenario = ThresholdScenario(setup, m, bits=1, dp=dp)
        view = scenario.combined_view(x, 0)
        _, coeffs = decode(scenario.ctx, view)
        sizes[dp] = float(np.max(np.abs(residual(view, coeffs, scenario.t))))
    assert sizes[False] < 2**12 and sizes[True] < 2**12, sizes
