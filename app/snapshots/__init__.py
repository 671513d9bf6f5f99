"""PyTorch memory snapshots brought by users: parsed as data in a bounded child process
(``parse``), explained (``explain``), stored beside experiments (``app.snapshots.service``).

Torch-free: the API imports this package; nothing here runs a client's code.
"""
