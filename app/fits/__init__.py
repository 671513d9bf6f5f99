"""Fit searches: the largest batch (or sequence) that fits on a GPU, found by predicting and
measuring.
"""
