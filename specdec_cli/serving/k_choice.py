"""The fixed k every engine is written with: a report's, the profile's, or the default fixed k."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..specs import MAX_K, Profile


@dataclass(frozen=True)
class KChoice:
    k: int
    reason: str  # for the output's comment line
    warning: str | None = None  # for stderr


def read_report(path: Path) -> dict[str, Any]:
    """A bench or tune-k JSON report (`specdec bench|tune-k --format json -o FILE`)."""
    hint = "write one with `specdec tune-k --format json -o FILE` or `specdec bench --format json -o FILE`"
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--from-report: '{path}' is not a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"--from-report: '{path}' is not a JSON report (not UTF-8 text: byte {exc.start}); {hint}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--from-report: '{path}' is not a JSON report ({exc.msg.lower()} at line {exc.lineno}); {hint}") from None
    except OSError as exc:
        raise UsageError(f"--from-report: cannot read '{path}' ({exc.strerror or exc}); {hint}") from None
    if not isinstance(data, dict) or not ("best_fixed_k" in data or isinstance(data.get("results"), list)):
        raise UsageError(f"--from-report: '{path}' is not a bench or tune-k report; {hint}")
    return data


def _valid_k(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_K


def k_from_report(report: dict[str, Any], label: str) -> tuple[int, str]:
    """The fixed k a report recommends, and how it was chosen.

    tune-k: its fastest fixed k (`best_fixed_k`; `best_k` may be 'auto').
    bench at a fixed k: that k. bench at k: auto: the mean draft length auto chose per target
    forward, (tau - 1) / acceptance, from the specdec row (tau = tokens per target forward).
    """
    if "best_fixed_k" in report:
        k = report.get("best_fixed_k")
        if not _valid_k(k):
            raise UsageError(f"--from-report: {label} has no fixed k that finished (best_fixed_k is {k!r})")
        return k, f"the fastest fixed k of the tune-k report {label}"
    row = next((r for r in report["results"] if isinstance(r, dict) and r.get("method") == "specdec"), None)
    if row is None:
        raise UsageError(f"--from-report: {label} has no specdec row (run bench with --methods including specdec)")
    measured_k = (report.get("settings") or {}).get("k")
    if _valid_k(measured_k):
        return measured_k, f"the k the bench report {label} was measured at"
    tau, acceptance = row.get("mean_accepted_length"), row.get("acceptance_rate")
    if not isinstance(tau, (int, float)) or not isinstance(acceptance, (int, float)) or tau < 1:
        raise UsageError(f"--from-report: {label}'s specdec row has no acceptance and tau to derive k from")
    if acceptance <= 0:  # a measured 0%: every draft was rejected, so their length left no trace in tau
        raise UsageError(f"--from-report: {label}'s specdec row kept no drafts (acceptance 0%, tau {tau:.2f}), so it "
                         "cannot tell how long k: auto's drafts were; bench at a fixed k (-k N) or run tune-k")
    mean_k = (tau - 1.0) / acceptance
    k = min(MAX_K, max(1, math.floor(mean_k + 0.5)))
    return k, (f"the mean draft length k: auto chose in the bench report {label} "
               f"((tau {tau:.2f} - 1) / acceptance {acceptance:.1%} = {mean_k:.2f})")


def choose_k(profile: Profile, report: dict[str, Any] | None = None, label: str = "") -> KChoice:
    """A fixed k for the engines: the report's, if one is given, else the profile's fixed k, else
    (k: auto and no report) the default fixed k (5, at most adaptive.k_max), with a warning."""
    if report is not None:
        k, reason = k_from_report(report, label)
        warning = None
        named = report.get("profile")
        if isinstance(named, str) and named != profile.name:
            warning = f"--from-report: {label} was measured on profile '{named}', not '{profile.name}'"
        return KChoice(k, f"k = {k}: {reason}", warning)
    if profile.k != "auto":
        return KChoice(profile.k, f"k = {profile.k}: the profile's k")
    # adaptive.k_max is a safety bound (32), far deeper than any fixed k should be
    k = min(profile.adaptive.k_max, Profile.k)
    return KChoice(
        k, f"k = {k}: the default fixed k (k: auto has no engine equivalent; give --from-report for a tuned k)",
        f"k: auto has no serving-engine equivalent; writing k = {k} (the default fixed k). "
        "Pass --from-report FILE (a tune-k or bench JSON report) for the k your runs chose",
    )
