"""n-of-n threshold BFV: the crypto of the threshold mode, bytes in and bytes out, no network.

What it holds:

- `wire`: the common random polynomial from an agreed seed, commit-then-reveal of key shares,
  the exact smudging sampler, and the decryption-share format with its binding checks.
- `keys`: each holder's secret s_i and public-key share p_i, and the collective public key.
- `setup`: the collective key setup as a state machine of rounds (holder side, relay side).
- `galois`: the collective Galois keys, one linear round over a common polynomial per element.
- `relin`: the collective relinearization key (encrypting s^2), two rounds with an ephemeral secret
  per holder (Mouchet et al.'s RKG), loaded as SEAL RelinKeys; `join_context` for the join's parameters.
- `context`: a public TenSEAL context that encrypts under the collective public key.
- `c1`: the c1 part of ciphertexts, the owners' signed c1 and the check a holder runs on it.
- `decrypt`: the holders' decryption shares (smudged, bound to the ciphertext or its c1) and
  the n-of-n combine.
- `shamir`: t-of-N key shares (each holder's s_i Shamir-shared per RNS prime) and the Lagrange
  weights that let any t holders' shares combine.

May import `he_partition.core`, its siblings in `he_partition.he` (`bfv`, `rns`, `seal_io`) and
TenSEAL; nothing above it (no party, network or storage).

Privacy promise: no one short of all n holders (of t, with a t-of-N key) learns anything about the
secret key or a plaintext. Each share is smudged so the combiner's view of a ciphertext depends on the data only
through its plaintext, and a holder shares only ciphertexts whose c1 is the owners' signed
aggregate, so a chosen ciphertext cannot read its secret off a share.
"""
