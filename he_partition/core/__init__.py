"""The protocol core: noise, the vector interface, measurements, estimation, summaries, budget arithmetic.

May import: numpy, the standard library, and each other. Never TenSEAL, a party, the network
or storage; not the strategies, the protocol, the join or the methods above it.
"""
