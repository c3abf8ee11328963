"""promptsched: a durable scheduler for LLM prompts, coordinated through Postgres."""

__version__ = "0.1.0"
