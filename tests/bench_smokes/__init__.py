"""The benches' smoke tests: each bench run end to end at tiny sizes, in a process of its own,
to show it still runs and prints its line. They test bench/, not the product, and take about a
fifth of the suite's CPU, so `make test` leaves them out and `make test-bench` runs them; CI
runs both (.ci/run)."""
