"""The source documents' further methods: p-views, Bayesian DP for correlated records, guidance, audit.

May import `he_partition.core`, `he_partition.strategies` and `he_partition.protocol`; no party,
network or storage.
"""
