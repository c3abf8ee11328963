"""What the HTTP API and the console share on the aiohttp side, and nothing else: the
dependencies an application carries, token authentication, and the live progress hub."""
