"""python -m bench NAME [args]: run bench/NAME.py."""

import runpy
import sys

if len(sys.argv) < 2:
    sys.exit("usage: python -m bench NAME [args]  (NAME: a module in bench/, e.g. buffer_write)")
name = sys.argv.pop(1)
runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
