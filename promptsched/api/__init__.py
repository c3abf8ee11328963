"""The HTTP API (aiohttp): health, readiness, metrics and the /v1 resources."""
