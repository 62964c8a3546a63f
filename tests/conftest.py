"""Hypothesis profiles: `ci` (default: bounded, derandomized) and `long` (scripts/properties_long.py)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("THEMIS_HYPOTHESIS_PROFILE", "ci"))
