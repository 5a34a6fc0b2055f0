"""Moved: run `python -m tools.gpu_check` (the study and the tools have folders of their own)."""
import sys

sys.exit(f"gpu_check.py moved: run python -m tools.gpu_check {' '.join(sys.argv[1:])}".rstrip())
