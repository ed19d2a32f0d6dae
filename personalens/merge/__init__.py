"""`personalens merge`: check that every scenario of a selection is present exactly once across the
shards of a run (check.py), from the command (command.py)."""
