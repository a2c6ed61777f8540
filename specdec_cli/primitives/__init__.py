"""The low-level pieces every layer uses: seeded sampling (the race, position noise, vocab fits),
token-tree shapes and masks, and the calls that leave the tensor program (device_calls). Imports
nothing of specdec but specs."""
