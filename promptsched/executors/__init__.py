"""Executors: the named providers that turn a rendered prompt into output."""
