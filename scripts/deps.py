"""Print the requirements of pyproject.toml (base plus the named extras), one a line.

The Makefile installs dependencies from this list instead of installing the project
itself, so a checkout runs from its own directory and worktrees can share one venv.
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(__file__).resolve().parent.parent.joinpath("pyproject.toml").read_text())["project"]
extras = project.get("optional-dependencies", {})
requirements = list(project["dependencies"])
for name in sys.argv[1:]:
    if name not in extras:
        sys.exit(f"deps.py: unknown extra {name!r}; known: {', '.join(sorted(extras))}")
    requirements += extras[name]
print("\n".join(requirements))
