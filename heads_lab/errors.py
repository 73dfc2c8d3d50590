"""The few errors a user can cause. The CLI prints them as one line and exits with code 2;
every other exception is a bug and keeps its traceback."""


class HeadsLabError(Exception):
    """Base class: a problem with the user's input, reported as one line."""


class ConfigError(HeadsLabError):
    """A config value that composes but cannot work (e.g. heads not dividing d_model)."""


class DataError(HeadsLabError):
    """Missing, empty or malformed data."""


class CheckpointError(HeadsLabError):
    """A checkpoint or run dir that cannot be read."""


def finished_run(run_dir, key: str = "hydra.run.dir", why: str = "") -> ConfigError:
    """Refusal to write into a dir holding a finished run's results (`key`: the dir's
    override, hydra.sweep.dir for a sweep; `why`: how its settings differ, in parentheses)."""
    return ConfigError(f"{run_dir} already holds a finished run (results.json){why}; choose "
                       f"another {key}, or delete that dir to run again")
