"""The homomorphic-encryption scheme: BFV on TenSEAL, the key holder's view, the join's ciphertext products,
and n-of-n threshold BFV (`threshold/`).

The only package that imports TenSEAL. May import `he_partition.core`; nothing above it.
"""
