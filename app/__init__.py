"""vramlab's API: validates experiment specs, queues them, serves results. Never imports torch."""
