"""The web pages' Jinja2 templates (rendered by app/ui/endpoints.py)."""
