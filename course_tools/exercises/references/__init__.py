"""Every lesson's exercises: importing this package registers them all with ``course_tools.exercises.checks``.

One module per lesson (``lesson00.py``, ``lesson01.py``, ...), found automatically.
"""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_info.name}")
