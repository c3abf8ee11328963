"""``python -m promptsched`` is the ``promptsched`` command."""

import sys

from promptsched.cli import main

sys.exit(main())
