"""Fakes of external services that tests run for real over loopback."""
