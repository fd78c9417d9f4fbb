"""``python -m course_tools.dev ARGS`` runs ``course-dev ARGS`` (how scripts call it without the entry point)."""

import sys

from course_tools.dev import main

sys.exit(main())
