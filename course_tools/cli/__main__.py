"""``python -m course_tools.cli ARGS`` runs ``course ARGS`` (how scripts call it without the entry point)."""

import sys

from course_tools.cli import main

sys.exit(main())
