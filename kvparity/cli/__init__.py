"""The ``kvparity`` command line: one module per subcommand."""
