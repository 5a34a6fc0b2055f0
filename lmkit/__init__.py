"""The library the scripts share (docs/implementation.md, "Files"): data, tokenizers, checkpoints,
resuming, a run's checks and records, the probes, the memory plan, the Hugging Face wrapper,
devices, measuring and torchrun's plumbing. It imports the network (model.py) and the configurator,
never a script."""
import os

# OpenMP's idle threads spin while they wait for work: on a machine where another job holds a core,
# a 2-thread CPU run then crawled (tools/bench.py's threads table; docs/testing.md). Sleeping
# instead costs a lone run little. libgomp reads this once, when torch loads it: every script
# imports lmkit before torch (tests/test_layout.py). A policy the environment gives stays.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
