"""What the decoding core drives: the LM interface over B rows, KV caches (dynamic and static),
compiled steps and the choice of when to compile."""
