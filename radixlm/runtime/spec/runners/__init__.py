"""Runners of draft models over the target's slots."""
