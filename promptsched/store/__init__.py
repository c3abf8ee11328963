"""The store: every SQL statement, the schema migrations, and the connection pool."""
