# The sink study's decay arm (v4, docs/analysis.md), layered on config/sink_study.py and
# config/sink_study_v2.py: v1's weight-decay rule, every matrix decays, alpha_proj and g_proj
# included (v2's recipe leaves them out). Under v1's rule Figure 4's affine < sink was contradicted
# (p about 0.02); under v2's and v3's it was supported: this arm tests whether the rule decides it.
# Expect from an affine run: about 4 minutes on one CPU thread with layers compiled, as v3's.
# Run one alone, after preparing its data (config/sink_study_v2.py's header), with a teacher:
#   python train.py config/sink_study.py config/sink_study_v2.py config/sink_study_decay.py \
#       --attention=affine --seed=601 --teacher=out/sink_study_v4/train/teacher_softmax_s705
no_decay = []
