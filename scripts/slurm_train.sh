#!/bin/bash
# Train one paper row on one or more 8-GPU nodes under SLURM: one torchrun per node, which starts a rank per GPU
# and meets the other nodes at a c10d rendezvous on the job's first node.
#   sbatch --nodes=2 scripts/slurm_train.sh config/affine_3b.py                  # 16 GPUs
#   sbatch --nodes=1 scripts/slurm_train.sh config/affine_1b.py --max_iters=100  # overrides go to train.py
# Submit from the repository root. out_dir, data_dir and the teacher must be on a filesystem every node sees:
# rank 0 writes out_dir/ckpt.pt, every rank reads it on resume. If out_dir already holds a checkpoint (a requeued
# or resubmitted job), train.py continues from it by itself (init_from='auto'). SLURM's SIGTERM (--signal below,
# scancel, preemption) reaches train.py through srun and torchrun: it finishes the step, saves a checkpoint and
# exits; should torchrun kill the ranks before that, the run continues from the last eval_interval checkpoint.
# Add torchrun's --max-restarts=N below to have a dead rank restarted in place (from the last checkpoint too).
#SBATCH --job-name=affine-scaled
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
#SBATCH --signal=TERM@600
#SBATCH --output=slurm-%j.out
set -euo pipefail
CONFIG=${1:?usage: sbatch [--nodes=N] scripts/slurm_train.sh config/ROW.py [--key=value ...]}
shift

HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)

srun --kill-on-bad-exit=1 torchrun \
    --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node="${SLURM_GPUS_ON_NODE:-8}" \
    --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:29500" \
    train.py "$CONFIG" "$@"
