"""Sweep the lookahead k over the bench's specdec method, beside the analytic speedup model.

Leviathan et al. (2023): with per-token acceptance a (stats.alpha: kept / judged drafts), a step
that drafts k tokens emits on average (1 - a^(k+1)) / (1 - a) tokens, and costs k*c + v(k) target
steps, where c is the cost of one draft forward relative to one target step and v(k) the cost of verifying k drafts (k+1 positions)
relative to one target step. All of a, c and v(k) are measured in the same run as the speeds they
predict, so "predicted" is what the pair allows on this machine, and the gap to "measured" is the
engine's own overhead.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..api import Pipeline
from ..decoding.stats import alpha
from ..errors import UsageError
from ..files import write_atomically
from ..profile import parse_profile
from ..profile_files import parse_yaml, shipped_profiles_dir, user_profiles_dir
from ..specs import AUTO_TREE, TreeSpec, Workload
from .engine_methods import Clock, EngineMethod
from .local import Bench
from .options import BenchSettings, require_plotting
from .paired import TIE
from .workload import BenchPrompt


def row_label(k: int | str) -> str:
    """A tune-k row's name: k=4, k=auto, tree=16."""
    return k if isinstance(k, str) and k.startswith("tree=") else f"k={k}"


def expected_tokens(a: float, k: int) -> float:
    """Tokens per step when each of k drafts is kept with probability a (i.i.d.), bonus included."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(a: float, k: int, c: float, v: float) -> float:
    """Speedup over plain decoding: tokens per step over the step's cost in target steps."""
    return expected_tokens(a, k) / (k * c + v)


@dataclass
class TuneResult:
    bench: Bench
    ks: list[int]
    include_auto: bool
    trees: dict[str, TreeSpec] = field(default_factory=dict)

    def plain_step_seconds(self) -> float | None:
        """Seconds per target forward of plain decoding (one token in, sampling and sync included)."""
        runs = [r for r in self.bench.results if r.method == "plain" and r.stats and r.stats.target_forwards]
        steps = sum(r.stats.target_forwards for r in runs)
        return sum(r.stats.verify_seconds for r in runs) / steps if steps else None

    def engine_runs(self, k: int | str):
        return [r for r in self.bench.results if r.method == row_label(k) and r.stats]

    def draft_cost_ratio(self) -> float | None:
        """c: one draft forward (one drafted token) over one plain target step."""
        step = self.plain_step_seconds()
        runs = [r for k in self.ks for r in self.engine_runs(k)]
        drafted = sum(r.stats.drafted for r in runs)
        if not step or not drafted:
            return None
        return sum(r.stats.draft_seconds for r in runs) / drafted / step

    def verify_cost_ratio(self, k: int) -> float | None:
        """v(k): one verification of k drafts over one plain target step."""
        step = self.plain_step_seconds()
        runs = self.engine_runs(k)
        forwards = sum(r.stats.target_forwards for r in runs)
        if not step or not forwards:
            return None
        return sum(r.stats.verify_seconds for r in runs) / forwards / step

    def alpha(self, k: int | str, prompts) -> float | None:
        """The per-token acceptance a of the model (stats.alpha), over these prompts' runs at k."""
        ids = {p.id for p in prompts}
        return alpha([s for r in self.engine_runs(k) if r.prompt.id in ids for s in r.stats.steps])

    def predicted(self, k: int, prompts, c: float | None, v: float | None) -> float | None:
        """The analytic speedup, per prompt from that prompt's own a, then the median over prompts:
        the same aggregation as the measured speedup it stands beside."""
        if c is None or v is None:
            return None
        values = [predicted_speedup(a, k, c, v) for p in prompts if (a := self.alpha(k, [p])) is not None]
        return statistics.median(values) if values else None

    def rows(self) -> list[dict[str, Any]]:
        """One row per k over every finished prompt, with the same rows per category when there are any."""
        prompts = self.bench.complete_prompts()
        rows = self.rows_over(prompts)
        for category in sorted({p.category for p in prompts if p.category}):
            for row, per in zip(rows, self.rows_over([p for p in prompts if p.category == category])):
                row.setdefault("per_category", {})[category] = {key: per[key] for key in per if key not in ("k", "v")}
        return rows

    def rows_over(self, prompts) -> list[dict[str, Any]]:
        c = self.draft_cost_ratio()
        rows = []
        for k in self.ks + (["auto"] if self.include_auto else []) + list(self.trees):
            summary = self.bench.method_summary(row_label(k), prompts)
            v = self.verify_cost_ratio(k) if k != "auto" else None
            rows.append({
                "k": k,
                "tokens_per_second": summary["tokens_per_second"],
                **{key: value for key, value in summary.items() if key.startswith("speedup")},
                "acceptance_rate": summary["acceptance_rate"],
                "alpha": self.alpha(k, prompts),
                "mean_accepted_length": summary["mean_accepted_length"],
                "predicted_speedup": self.predicted(k, prompts, c, v) if isinstance(k, int) else None,
                "v": v,
            })
        return rows

    def best(self, rows: Sequence[dict[str, Any]], fixed_only: bool) -> int | str | None:
        """The fastest row whose figure can be taken at its word (marked ones are never ranked)."""
        candidates = [r for r in rows if r["speedup"] and not r.get("speedup_flags")
                      and (isinstance(r["k"], int) or not fixed_only)]
        if not candidates:
            return None
        top = max(r["speedup"] for r in candidates)
        # the smallest k within the tie band of the fastest ('auto' sorts after every number)
        tied = [r["k"] for r in candidates if r["speedup"] >= top * (1 - TIE)]
        fixed = sorted(k for k in tied if isinstance(k, int))
        return fixed[0] if fixed else tied[0]

    def verdict(self, rows: Sequence[dict[str, Any]], best: int | str | None) -> dict[str, Any]:
        """Whether `best` beat the runner-up (plain, when it is the only row) outside the noise:
        faster in (nearly) every paired run, prompt by prompt and repeat by repeat."""
        verdict: dict[str, Any] = {"k": best, "against": None, "outside_noise": False}
        if best is None:
            return verdict
        others = sorted((r for r in rows if r["k"] != best and r["speedup"] and not r.get("speedup_flags")),
                        key=lambda r: r["speedup"], reverse=True)
        against = row_label(others[0]["k"]) if others else "plain"
        paired = self.bench.paired(row_label(best), against, self.bench.complete_prompts())
        verdict.update(against=against, outside_noise=paired.outside_noise(), **paired.describe())
        return verdict

    def summary(self) -> dict[str, Any]:
        rows = self.rows()
        plain = self.bench.method_summary("plain", self.bench.complete_prompts())
        bench = self.bench.summary()
        best = self.best(rows, fixed_only=False)
        verdict = self.verdict(rows, best)
        return {
            "profile": bench["profile"],
            "machine": bench["machine"],
            "settings": bench["settings"],
            "dtype": bench["dtype"],
            "plain_tokens_per_second": plain["tokens_per_second"],
            "rows": rows,
            "best_k": best,
            "best_fixed_k": self.best(rows, fixed_only=True),
            "recommended_k": best if verdict["outside_noise"] else None,
            "verdict": verdict,
            "c": self.draft_cost_ratio(),
            "v": {str(r["k"]): r["v"] for r in rows if r["v"] is not None},
            "plain_step_seconds": self.plain_step_seconds(),
            "compile_seconds": bench["compile_seconds"],
            "outputs_identical": bench["outputs_identical"],
            "differences": bench["differences"],
        }


def run_tune(pipeline: Pipeline, prompts: list[BenchPrompt], settings: BenchSettings, ks: Sequence[int],
             include_auto: bool = True, on_progress: Callable[[str], None] | None = None,
             holder: list | None = None, trees: dict[str, TreeSpec] | None = None,
             clock: Clock | None = None) -> TuneResult:
    """Plain decoding, a chain per k (and k: auto), and a token tree per entry of `trees`."""
    trees = trees or {}
    methods = [EngineMethod("plain", pipeline, None, plain=True, clock=clock)]
    methods += [EngineMethod(row_label(k), pipeline, k, clock=clock) for k in ks]
    if include_auto:
        methods.append(EngineMethod(row_label("auto"), pipeline, "auto", clock=clock))
    methods += [EngineMethod(label, pipeline, pipeline.profile.k, tree=shape, clock=clock) for label, shape in trees.items()]
    bench = Bench(pipeline, prompts, settings, methods)
    result = TuneResult(bench, list(ks), include_auto, trees)
    if holder is not None:  # lets the caller report finished rows after Ctrl-C
        holder.append(result)
    bench.run(on_progress)
    return result


def sweep_size(ks: Sequence[int], include_auto: bool, trees: dict[str, TreeSpec]) -> int:
    """The methods run_tune times: plain, a chain per k, k: auto, a tree per entry of `trees`."""
    return 1 + len(ks) + int(include_auto) + len(trees)


def tune_workload(prompts: int, settings: BenchSettings, ks: Sequence[int], include_auto: bool,
                  trees: dict[str, TreeSpec]) -> Workload:
    """The generations run_tune runs, all on our engine, which `compile: auto` weighs."""
    runs = prompts * settings.repeats * sweep_size(ks, include_auto, trees)
    return Workload.of(runs, settings.max_new_tokens)


# --------------------------------------------------------------------------- --write



def top_level(key: str) -> re.Pattern:
    """A one-line top-level `key: value` (comment kept apart)."""
    return re.compile(
        rf"""^(?P<key>{key}|"{key}"|'{key}')[ \t]*:[ \t]*(?P<value>[^#\n]*?)(?P<rest>[ \t]*(#[^\n]*)?)$""", re.MULTILINE
    )


def with_setting(text: str, key: str, value: str, note: str | None = None) -> str:
    """The profile text with its top-level `key:` set, key order and other comments kept.

    The comments that described the old value go: the one at the end of the key's line and the
    comment lines directly above it. `note` (say, where the new value came from) takes their place."""
    setting = f": {value}" + (f"   # {note}" if note else "")
    match = top_level(key).search(text)
    if match is None:
        return text + ("" if text.endswith("\n") or not text else "\n") + key + setting + "\n"
    before = text[: match.start()].splitlines(keepends=True)
    while before and before[-1].lstrip().startswith("#"):
        before.pop()
    return "".join(before) + match.group("key") + setting + text[match.end():]


def with_k(text: str, k: int | str, note: str | None = None) -> str:
    return with_setting(text, "k", str(k), note)


def tree_setting(tree: TreeSpec | None) -> str:
    if tree is None:
        return "null"
    if tree.auto and tree == AUTO_TREE:
        return "auto"
    auto = ", auto: true" if tree.auto else ""
    return f"{{nodes: {tree.nodes}, width: {tree.width}, depth: {tree.depth}{auto}}}"


def editable_profile(profile_path: Path) -> tuple[Path, str]:
    """The file tune-k --write edits and its text: the user's own file in place; for a shipped profile,
    its copy in the user's profile folder (where `-p NAME` finds it before the shipped one), headed
    by a line that says its notes describe the shipped file."""
    source = Path(profile_path).resolve()
    if source.parent != shipped_profiles_dir().resolve():
        return source, source.read_text(encoding="utf-8")
    target = user_profiles_dir() / source.name
    if target.exists():
        return target, target.read_text(encoding="utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target, (f"# A copy of the shipped profile {source.name}, edited by specdec tune-k --write: comments "
                    "below that report measurements describe the shipped settings.\n") + source.read_text(encoding="utf-8")


def write_k_table(profile_path: Path, table: dict[int, int], note: str | None = None) -> Path:
    """Put `k_by_batch_size: {1: 5, 4: 3}` into the profile (where editable_profile says), one atomic write."""
    target, text = editable_profile(profile_path)
    value = "{" + ", ".join(f"{size}: {k}" for size, k in sorted(table.items())) + "}"
    updated = with_setting(text, "k_by_batch_size", value, note)
    check = parse_profile(parse_yaml(updated, str(target)), str(target))
    if check.k_by_batch_size != tuple(sorted(table.items())):
        raise UsageError(f"{target}: could not set k_by_batch_size (the file sets it in a way this tool does not edit)")
    write_atomically(target, updated)
    return target


def write_best_k(profile_path: Path, k: int | str, tree: TreeSpec | None = None, note: str | None = None) -> Path:
    """Put k (or, when a tree won, its shape) into the profile (where editable_profile says), with
    `note` beside it. One atomic write."""
    target, text = editable_profile(profile_path)
    if tree is not None:  # a tree won: its shape; the chain's k stays as it was
        updated = with_setting(text, "tree", tree_setting(tree), note)
    else:  # a chain won: its k, and no tree (if the file had one)
        updated = with_k(text, k, note)
        if top_level("tree").search(updated):
            updated = with_setting(updated, "tree", "null", "a chain of k won in tune-k")
    check = parse_profile(parse_yaml(updated, str(target)), str(target))
    if (check.k, check.tree) != ((k, None) if tree is None else (check.k, tree)):
        raise UsageError(f"{target}: could not set the setting (the file sets it in a way this tool does not edit)")
    write_atomically(target, updated)
    return target


def plot_tune(summary: dict[str, Any], path: Path) -> None:
    require_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in summary["rows"] if isinstance(r["k"], int)]
    ks = [r["k"] for r in rows]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(ks, [r["speedup"] for r in rows], "o-", label="measured")
    axis.plot(ks, [r["predicted_speedup"] for r in rows], "s--", label="predicted (Leviathan et al.)")
    auto = [r for r in summary["rows"] if r["k"] == "auto" and r["speedup"]]
    if auto:
        axis.axhline(auto[0]["speedup"], color="gray", linestyle=":", label="k: auto")
    axis.axhline(1.0, color="black", linewidth=0.5)
    axis.set_xticks(ks)  # k is a whole number: no tick at 2.25
    axis.set_xlabel("k (tokens drafted per step)")
    axis.set_ylabel("speedup over plain decoding")
    recommended = summary["recommended_k"]
    axis.set_title(f"{summary['profile']}: " + (f"recommended {row_label(recommended)}" if recommended is not None
                                                 else "no recommendation (within noise)"))
    axis.legend()
    save_figure(figure, path)


def save_figure(figure, path: Path) -> None:
    """Write a PNG atomically (a temporary file renamed over the path) and free the figure."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(staging, dpi=120)
    staging.replace(path)
    plt.close(figure)

