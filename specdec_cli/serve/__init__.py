"""`specdec serve`: the OpenAI-compatible server (HTTP on an event loop, the engine on its own thread)."""
