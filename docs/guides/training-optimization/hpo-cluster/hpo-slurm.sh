#!/bin/bash
# Tuning workers as a Slurm job array: one worker per array task, all on one study.
# Create the study once, then, from the folder that holds hpo_digits.yaml:
#   export HPO_STORAGE=postgresql+psycopg2://tuner@db.internal/hpo   (password: ~/.pgpass)
#   sbatch hpo-slurm.sh
#SBATCH --job-name=hpo-digits
#SBATCH --array=0-7
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=04:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --output=hpo-%A_%a.out
# 8 workers, one GPU each (Slurm sets CUDA_VISIBLE_DEVICES: --device auto finds cuda:0).
# --timeout: claim no trial after 3 h 40 min, so that the last ones end before the time limit.
# --signal: SIGTERM 2 minutes before the limit returns a trial still running to the queue;
# --requeue: a preempted task starts again, joins the study and runs it.
set -euo pipefail
: "${HPO_STORAGE:?export HPO_STORAGE=postgresql+psycopg2://... before sbatch}"
srun python -m trainopt.hpo hpo_digits.yaml --storage "$HPO_STORAGE" \
    --device auto --timeout 13200 --no-plots --no-progress
