"""How a person reads what promptsched stores, the same in the CLI, the console and every
message: instants in a zone with their distance from now, durations and values in words, cut
text marked with an ellipsis, and schedule expressions in words."""
