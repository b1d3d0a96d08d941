"""The exit statuses of ``windtunnel`` commands, in one place (no imports: anything may use it).

0 is success; ``EXIT_BAD_INPUT`` is bad input (one line naming the problem, nothing written);
``EXIT_INTERRUPTED`` is a Ctrl-C, after which a run's state is saved. The job runners read
the second from their workers to tell a run stopped from outside from one that failed.
"""

EXIT_BAD_INPUT = 2  # argparse's own status for a usage error
EXIT_DIVERGED = 3  # the loss became NaN or infinite (the last checkpoint kept)
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT
