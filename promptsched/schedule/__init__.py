"""Pure schedule math: specs, fire times across DST, misfire planning and jitter (no I/O)."""
