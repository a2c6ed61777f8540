"""The `specdec` command: the Typer app, one module per command, the live view and output."""
