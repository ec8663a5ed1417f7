"""`python3 -m trainsup.run`, the launcher's documented command (also installed as
`trainsup-run`): the launcher agent lives in trainsup.launch.run; this name stays so that the
command and every script that uses it keep working."""
from .launch.run import main

if __name__ == "__main__":
    main()
