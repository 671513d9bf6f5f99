"""vramlab's client: submit GPU memory experiments to a vramlab service, follow them, and
record a training program's memory. httpx is its one dependency (torch too, for
``record``, which runs in the environment that already has it)."""
