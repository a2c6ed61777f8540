"""`specdec profiles`: list the profiles, or show one resolved."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import UsageError
from .output import Output

profiles_app = typer.Typer(help="List the profiles, or show one resolved.", invoke_without_command=True)


@profiles_app.callback()
def profiles_list(ctx: typer.Context) -> None:
    """List the profiles that `-p NAME` can name (yours first, then the shipped ones)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..profile import ProfileError, load_profile
    from ..profile_files import list_profiles

    out = Output()
    rows = []
    for path in list_profiles():
        try:
            p = load_profile(path)
            rows.append((path.stem, p.target.model, p.drafter.describe(), str(p.k), str(path)))
        except ProfileError as exc:
            rows.append((path.stem, "(invalid)", str(exc).splitlines()[0], "", str(path)))
    out.listing(("name", "target", "drafter", "k", "file"), rows)


@profiles_app.command("show")
def profiles_show(
    name: Annotated[str, typer.Argument(help="profile name or path")],
    output_format: Annotated[str, typer.Option("--format", "-f", help="yaml or json")] = "yaml",
) -> None:
    """Print one profile with every default filled in; for a draft model whose vocab is not
    `shared`, the tokens it shares with the target (read from the two tokenizers, no weights)."""
    import yaml

    from ..profile import load_profile, profile_to_dict

    if output_format not in ("yaml", "json"):
        raise UsageError(f"--format: '{output_format}' is not one of yaml, json")
    profile = load_profile(name)
    data = profile_to_dict(profile)
    pairings = []
    if profile.drafter.paired_drafters():  # reading tokenizers takes transformers and torch: only then
        from ..drafters.vocab_pairing import vocab_pairings

        pairings = vocab_pairings(profile)
    out = Output()
    if output_format == "json":
        out.json_document(data | ({"vocab_overlap": [p.to_dict() for p in pairings]} if pairings else {}))
    else:
        out.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        for pairing in pairings:  # as comments: what is printed stays a profile that reads back
            out.write(f"# {vocab_line(pairing)}\n")


def vocab_line(pairing) -> str:
    """`vocab: auto → intersect — 39,237 tokens shared (...)`, or why the overlap is unknown."""
    where = "" if pairing.drafter == "drafter" else f"{pairing.drafter} "
    if pairing.overlap is None:
        return f"{where}vocab: {pairing.vocab} — overlap unknown: {pairing.unknown}"
    rule = f" → {pairing.rule}" if pairing.rule != pairing.vocab else ""
    return f"{where}vocab: {pairing.vocab}{rule} — {pairing.overlap.describe()}"
