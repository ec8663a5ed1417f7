"""Operator commands (process: the operator's shell, anywhere the run directory or the
quarantine directory can be read: a login node needs no torch and no GPU):

  trainsup quarantine list|add|remove|exclude-arg   the records that keep hosts out of jobs (cli)
  trainsup report RUN_DIR                           a run's timeline and what its incidents cost
"""
