"""The ``ragate`` command: one module per subcommand, each exposing ``register(subparsers)``."""
