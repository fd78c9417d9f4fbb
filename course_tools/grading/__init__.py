"""The pieces of ``course grade``: reading submissions, the per-submission sandbox, the worker that
runs inside it, the results channel, and the gradebook. ``course_tools.grading.grade`` ties them together."""
