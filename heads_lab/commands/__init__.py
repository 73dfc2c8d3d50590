"""The verbs a user types — `heads-lab train | eval | analyze | prune | report | info | bench`
— one module each (cli.py dispatches), and the command line of those that read a trained run
back (command.py)."""
