"""Computation role: stores encrypted submissions, computes noised measurements under encryption, runs releases."""
