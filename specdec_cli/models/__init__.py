"""Loading models, choosing devices and dtypes, and the target's forward (eager or compiled)."""
