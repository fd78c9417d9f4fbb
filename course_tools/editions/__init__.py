"""Editions of the lessons: other languages and slides, both built from the English notebooks.

``translate`` builds the Korean notebooks and documents from ``translations/<lang>/``; ``slides`` builds
reveal.js decks from a lesson's stored outputs (``slide_templates/``); ``banner`` writes the line that
marks every generated file with its source and the command that rebuilds it.
"""
