"""Placeholder: filled in by the baseline-policy work (issue 3)."""
