"""The chaos suite: a multi-process soak under injected faults, and its invariant checker."""
