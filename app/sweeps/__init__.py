"""Sweeps: one base spec over a grid, an experiment a point, their rows and plots."""
