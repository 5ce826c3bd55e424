"""`python -m bench.steering` (and `python -m bench steering`): the bench's command line."""

from bench.steering.cli import main

if __name__ == "__main__":
    main()
