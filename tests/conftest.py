"""Test-run settings shared by every test package.

Property-based tests (Hypothesis) run derandomized by default, so the default run is
deterministic: a CI run cannot fail by chance. `HYPOTHESIS_PROFILE=explore` draws fresh
random examples (and keeps the example database) for bug hunting.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
