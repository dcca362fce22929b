"""Release strategies (gap, hier, dawa, privelet, auto) and the Hilbert order for 2-D domains.

Each strategy is a generator of linear measurements over `he_partition.core`; it never sees a
ciphertext. May import `he_partition.core` and each other; nothing above.
"""
