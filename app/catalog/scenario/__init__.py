"""Scenarios: a list of named-tensor steps, validated as data and planned without torch.

A spec with ``op: "scenario"`` carries ``steps`` instead of one op's shape and params.
Each step is a dict with ``do`` (create, op, move, pin, delete, empty_cache, synchronize,
repeat) and its fields; names refer to tensors earlier steps made. Nothing is evaluated:
every function a step names comes from fixed tables. ``bounds`` holds what a scenario
may ask, ``vocabulary`` the step kinds and functions, ``ledger`` the planner's named
tensors and bytes, ``steps`` what each step kind checks and does to the ledger, and
``plan`` the whole plan (``plan_scenario``). The op's catalog entry is in
``app/catalog/families/scenario.py``; the worker runs the steps in workers/scenario.py.
"""
