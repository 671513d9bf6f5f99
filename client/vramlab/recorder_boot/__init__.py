"""The folder ``vramlab record`` puts first on the recorded program's PYTHONPATH, so that
Python imports its ``sitecustomize`` at start-up. Nothing here is imported by the API."""
