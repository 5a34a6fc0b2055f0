"""The library the scripts share (docs/implementation.md, "Files"): data, tokenizers, checkpoints,
resuming, a run's checks and records, the probes, the memory plan, the Hugging Face wrapper,
devices, measuring and torchrun's plumbing. It imports the network (model.py) and the configurator,
never a script. Importing it changes nothing: each script sets what must be set before torch loads
(OMP_WAIT_POLICY) at its own top."""
