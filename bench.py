"""Moved: run `python -m tools.bench` (the study and the tools have folders of their own)."""
import sys

sys.exit(f"bench.py moved: run python -m tools.bench {' '.join(sys.argv[1:])}".rstrip())
