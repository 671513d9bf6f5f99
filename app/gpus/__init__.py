"""The GPU catalog (``GET /v1/gpus``): cards a plan may name, with their usable memory."""
