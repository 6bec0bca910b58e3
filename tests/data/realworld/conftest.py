"""The vendored libraries' own test suites are test data, never part of this project's suite.

``tests/verifiers/test_realworld.py`` runs each of them, on a copy, under
bare pytest and through the isolated ``tests`` verifier.
"""

collect_ignore_glob = ["*"]
