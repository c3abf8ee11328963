"""The operations the CLI, the HTTP API and the console share: validation, schedule, run and
notification operations, explain, and one rendering of rows to JSON."""
