"""Experiments side by side: their figures and overlaid timelines."""
