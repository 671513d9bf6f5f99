"""Presets: named, documented experiment specs from four articles' code examples.

``preset`` holds the Preset type (its overrides, refusals and GPU questions),
``builders`` the specs of the examples, and ``articles`` the presets themselves
(``PRESETS``, ``get_preset``).
"""
