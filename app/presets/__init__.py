"""Presets: named experiments that answer a question, queued in one call."""
