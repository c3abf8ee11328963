"""What a monitor's answer means: its JSON Schema (``schema.py``), when it notifies
(``conditions.py``), and what changed between two answers (``changes.py``). Pure, no I/O,
but for ``patterns.py``: the check of a schema with regular expressions, in a child process."""
