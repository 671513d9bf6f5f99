"""Catalog entries by family: one module per kind of op, each exporting ``ENTRIES``."""
