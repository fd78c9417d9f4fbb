"""Language editions are built from the English notebooks (`course translate`), whose outputs nbval already
checks; running them again would only double the test time. tests/test_translate.py checks they are in sync."""

collect_ignore_glob = ["*.ipynb"]
