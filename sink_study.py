"""Moved: run `python -m study.sink_study` (the study and the tools have folders of their own)."""
import sys

sys.exit(f"sink_study.py moved: run python -m study.sink_study {' '.join(sys.argv[1:])}".rstrip())
