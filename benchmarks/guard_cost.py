"""What torch.compile's guards on the model cost a compiled step: the median plain step of a profile.

    python benchmarks/guard_cost.py            # as specdec runs: no guards on the model's modules
    G=keep python benchmarks/guard_cost.py     # every module and parameter checked on every call

P=PROFILE picks the profile (default smollm2-demo), PLAIN=0 decodes with its drafter. Prints the
median step of each of 5 runs of 128 tokens and their median. Run the two alternately, alone on the
machine: the difference is what the guards cost per step.
"""

from __future__ import annotations

import os
import statistics

from specdec_cli import Pipeline
from specdec_cli.decoding.events import Verified
from specdec_cli.profile import load_profile, with_overrides
from specdec_cli.runtime.compiled_step import CompileSettings

PROMPT = "Write a short story about a lighthouse keeper."


def keep_module_guards() -> None:
    """torch.compile's default: guards on every module and parameter of the model."""
    options = CompileSettings.options
    CompileSettings.options = lambda self, device: {
        key: value for key, value in options(self, device).items() if key != "guard_filter_fn"
    }


def main() -> None:
    mode = os.environ.get("G", "skip")
    if mode == "keep":
        keep_module_guards()
    profile = with_overrides(load_profile(os.environ.get("P", "smollm2-demo")), compile="on", temperature=0.0)
    pipe = Pipeline(profile)
    decoder = pipe.decoder(drafter=None) if os.environ.get("PLAIN", "1") == "1" else pipe.decoder()
    ids = pipe.encode(PROMPT)
    for _ in decoder.stream(ids, max_new_tokens=16):  # compiles
        pass
    medians = []
    for _ in range(5):
        steps = [event.seconds for event in decoder.stream(ids, max_new_tokens=128) if isinstance(event, Verified)]
        medians.append(1000 * statistics.median(steps))
    print(f"guards {mode}: median step ms per run {[round(m, 2) for m in medians]}, median {statistics.median(medians):.2f}")


if __name__ == "__main__":
    main()
