"""The verbs a user types — `heads-lab train | eval | analyze | prune | report | info | bench`
— one module each (cli.py dispatches), with the sweeps that run them many times and the run
dirs they read back (runs.py)."""
