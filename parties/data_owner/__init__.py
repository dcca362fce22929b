"""Data-owner role: read local records, bound each person's contribution, encrypt and upload the histogram."""
