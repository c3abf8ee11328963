"""The operator console: server-rendered pages under ``/`` over the same service calls,
owner scoping and tokens as the HTTP API (``routes.mount`` adds it to the API's app)."""
