"""The web pages' Jinja2 templates (rendered by app/api/routes/ui.py)."""
