"""Analyst role: read-only queries (summaries, range counts with standard errors) against released summaries."""
