"""Serving engines: `specdec export` (one module per engine, named in registry.py) and the client and
wire formats `specdec bench --endpoint` reads a running server with."""
