"""course_tools: the course's machinery (checks, exercise references, assign, grade, notebook runs, doctor, CLI).

The model code that learners read lives in ``course_utils``; nothing there imports this package.
"""
