"""Allocator event traces: storage in chunks, the replay, and every export format (memory_viz's
pieces together).
"""
