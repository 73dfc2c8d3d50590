"""Hydra sweeps and single runs around a training: jobs (the task wrapper, checks before the
first job, a failed or stopped job recorded), signals (stop signals passed to a sweep's
workers), end (the sweep's last line), slurm (SLURM job states), kept_config (a run dir locked,
an earlier run's .hydra/ kept through a refused start), overrides (the command line as Hydra
reads it)."""
