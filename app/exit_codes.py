"""The exit codes of every `synchrony` command (scripts rely on them); a module of its own so that
the command line reads them without importing the pipeline."""

EXIT_OK = 0
EXIT_ERROR = 1  # an internal error
EXIT_BAD_INPUT = 2  # bad input or usage: nothing written
EXIT_PARTIAL = 3  # a partial result written (e.g. a recording without audio or without video)
