"""course_utils: the one library of the Transformer course; each concept lives here once."""

__version__ = "0.1.0"
