# The GPU plan's kd teacher (study/sink_study.py --plan=gpu), layered on config/sink_study.py,
# config/sink_study_v2.py and config/sink_study_gpu.py: 12 layers, 384 wide, 6:2 heads, trained with
# cross-entropy on seed 101, which no student has. Expect about a minute on one H200
# (docs/sink_study_gpu/attempt_1/: 45 s of steps, then start and compilation).
#   python train.py config/sink_study.py config/sink_study_v2.py config/sink_study_gpu.py \
#       config/sink_study_gpu_teacher.py --device=cuda --seed=101 --max_iters=732
n_layer = 12
n_embd = 384
n_head = 6
n_kv_head = 2
intermediate_size = 1152
