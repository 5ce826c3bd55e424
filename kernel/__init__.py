"""The kernel: what the web side and the workers both need and that needs no Django, no
database and no torch: the run config schema and its checks, the algorithm and reward-kind
declarations, the feedback fold arithmetic, the style preferences, the model-folder check,
input hygiene, the error classes, the JSON types and the one Registry shape. It imports no app,
no worker and nothing of rftweb (an import-linter contract in pyproject.toml), so it can be
imported and tested in a process where Django is not set up (tests/test_layers.py)."""
