"""Speed targets, each a ratio against a baseline measured in the same run."""
