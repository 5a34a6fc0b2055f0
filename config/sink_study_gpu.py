# The sink study's GPU plan (study/sink_study.py --plan=gpu), layered on config/sink_study.py and
# config/sink_study_v2.py: v2's design (matched pairs, no decay on any variant's own parameters, a
# larger teacher) on students deeper, wider and with a longer context: 8 layers, 256 wide, 8:4
# heads, 256-token windows, 64 a step.
# Expect the whole plan (one teacher, 4 variants x 3 seeds, 12M tokens a run, 4 runs side by side)
# in about 6 minutes of one H200: an estimate from its first attempt's runs
# (docs/sink_study_gpu/attempt_1/), which took about 12 while the study still made each record on
# one CPU thread between runs. Whether sinks reach more layers at this scale is what it finds, not
# what it promises. Run it once sealed (docs/analysis.md):
#   python -m study.sink_study --plan=gpu --report_dir=docs/sink_study_gpu
n_layer = 8
n_embd = 256
n_head = 8
n_kv_head = 4
intermediate_size = 768
block_size = 256
global_batch_size = 64
micro_batch_size = 64
