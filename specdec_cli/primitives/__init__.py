"""The low-level pieces every layer uses: seeded sampling (the race, position noise, vocab fits) and
token-tree shapes and masks. Imports nothing of specdec but specs."""
