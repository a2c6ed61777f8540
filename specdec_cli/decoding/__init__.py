"""The decoding loop: prefill, then draft -> verify -> commit, and what it reports."""
