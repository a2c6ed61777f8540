"""Structured output: what a generation must spell (a JSON schema, a regex, a grammar), read and
checked here (grammars.py, no torch) and walked token by token beside the decoding (matcher.py)."""
