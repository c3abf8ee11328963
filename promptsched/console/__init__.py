"""The operator console: server-rendered pages under ``/`` over the same operations
(``promptsched.ops``), owner scoping and tokens (``promptsched.web``) as the HTTP API; the
supervisor adds it to the app with ``routes.mount``."""
