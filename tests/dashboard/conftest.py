"""The dashboard tests start their servers, workers and CLI subprocesses through
tests/servers.py (loaded for every test)."""
