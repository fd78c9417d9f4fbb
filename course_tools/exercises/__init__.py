"""Exercises and checks: what a learner's notebook calls and what turns solutions into exercises.

``checks`` runs an exercise's cases against the learner's function (``check.NAME(fn)``) and scores the
self-check questions; ``references`` holds each lesson's reference implementations, cases and hints
(never mounted in the grading sandbox); ``predict`` hides a prediction's answer until the learner has
committed; ``assign`` writes ``exercises/`` from ``solutions/`` and ``nbgrader_release`` lays out an
nbgrader course folder that releases exactly those exercises; ``bare_torch`` is the run-time guard of
lesson 11's from-the-metal track (PyTorch's layers, losses and optimisers refused while its checks run).
"""

REFERENCES = "course_tools/exercises/references"
"""Where the references live, relative to the course folder: the grader leaves this folder out of the
sandbox, the library-shortcut rule and the message catalogue read its ``lessonNN.py`` files."""
