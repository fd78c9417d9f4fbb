"""course_utils: the one library of the Transformer course, the code the lessons derive.

Each concept lives here once, in a module named after it (``attention``, ``blocks``, ``gpt``, ``lora``,
...): a lesson builds the idea step by step, shows that its version equals the module's, and later
lessons import the module. Learners read it; it never imports ``course_tools``, the machinery around
it (checks, grading, the ``course`` command).
"""

__version__ = "0.1.0"
