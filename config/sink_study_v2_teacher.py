# The sink study v2's kd teachers, layered on config/sink_study.py and config/sink_study_v2.py:
# 6 layers, 192 wide, 6:2 heads (2,644,416 parameters, 3.19x the students' 828,544; the paper's
# teachers are about 3x theirs), trained with cross-entropy on seeds no student has.
# Expect about 10 minutes on one CPU thread (an estimate, not measured: about 3x a student's 3.5).
# Run one alone, after preparing its data (config/sink_study_v2.py's header):
#   python train.py config/sink_study.py config/sink_study_v2.py config/sink_study_v2_teacher.py \
#       --seed=101
n_layer = 6
n_embd = 192
n_head = 6
n_kv_head = 2
intermediate_size = 576
