"""The client commands of ``vramlab``, one module per thing they act on; each adds its
commands to the parser with ``register(sub, common)``."""
