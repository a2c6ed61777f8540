"""Which of a profile's drafters an engine runs, and what it leaves behind (each with the reason).

A chain keeps the members the engine can combine, or its strongest carriable member (a draft model
or EAGLE head, then early exit, then prompt lookup); the rest are named as not carried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..specs import DrafterSpec
from .common import EngineInfo, NotCarriedError
from .refs import EagleInfo, read_eagle


def drafter_members(drafter: DrafterSpec) -> list[DrafterSpec]:
    """A chain's members (auto's candidates) in order; any other drafter alone."""
    if drafter.drafters:
        return [d for d in drafter.drafters if d is not None]
    return [drafter]


KIND_NAMES = {"model": "draft model", "ngram": "prompt lookup (ngram)", "early-exit": "early exit",
              "medusa": "Medusa heads", "eagle": "EAGLE-1 head", "eagle3": "EAGLE-3 head"}
SLOTS = {"model": "model", "ngram": "ngram", "early-exit": "early_exit", "eagle": "head"}  # Medusa: none yet
PREFERENCE = ("model", "head", "early_exit", "ngram")  # Selection's slots, the strongest drafter first


def _preference(member: DrafterSpec) -> int:
    """A member's place in PREFERENCE; kinds no engine runs (Medusa) last."""
    slot = SLOTS.get(member.kind)
    return PREFERENCE.index(slot) if slot in PREFERENCE else len(PREFERENCE)


def _kind_name(d: DrafterSpec, head: str | None = None) -> str:
    if d.kind == "eagle" and head is None:
        return "EAGLE head"
    return KIND_NAMES.get(head or d.kind, d.kind)


@dataclass
class Selection:
    """The drafters an engine runs, and what of the profile's drafter it leaves behind."""

    model: DrafterSpec | None = None
    ngram: DrafterSpec | None = None
    early_exit: DrafterSpec | None = None
    head: DrafterSpec | None = None  # kind eagle (Medusa heads are carried nowhere)
    eagle: EagleInfo | None = None  # with head: its folder and kind
    not_carried: list[str] = field(default_factory=list)

    def first(self) -> DrafterSpec | None:
        return self.model or self.ngram or self.early_exit or self.head


def other_vocab(member: DrafterSpec) -> str | None:
    """'intersect' or 'text' for a draft model that drafts with another tokenizer, else None. `vocab:
    auto` is written as the target's tokenizer: which it turns out to be is known only once both
    tokenizers are loaded, and export loads none."""
    vocab = member.options.get("vocab") if member.kind == "model" else None
    return vocab if vocab in ("intersect", "text") else None


def other_vocab_refused(reason: str) -> dict[str, str]:
    """`unsupported` entries for an engine that drafts only with the target's tokenizer."""
    return {"model-intersect": reason, "model-text": reason}


def _member_key(member: DrafterSpec, unsupported: dict[str, str]) -> tuple[str, EagleInfo | None, str | None]:
    """The key `unsupported` is looked up by ('model-intersect' or 'model-text' for a draft with
    another tokenizer, 'model-gguf', 'eagle', 'eagle3', or the kind), an EAGLE head's info, and the
    reason an EAGLE head cannot be carried when its kind cannot be told here (not needed when the
    engine refuses both kinds alike)."""
    vocab = other_vocab(member)
    if vocab is not None and f"model-{vocab}" in unsupported:
        return f"model-{vocab}", None, None
    if member.kind == "model" and member.model and member.model.gguf_file:
        return "model-gguf", None, None
    if member.kind != "eagle":
        return member.kind, None, None
    info = read_eagle(member)
    if info.kind is not None:
        return info.kind, info, None
    refusals = {unsupported.get("eagle"), unsupported.get("eagle3")}
    if len(refusals) == 1 and None not in refusals:
        return "eagle", info, None
    return "eagle", info, info.problem


def select_drafters(drafter: DrafterSpec, engine: EngineInfo, unsupported: dict[str, str]) -> Selection:
    """Members the engine can run: `unsupported` maps a member (kind, 'model-gguf', 'model-intersect' /
    'model-text' (drafter.vocab), or for EAGLE heads 'eagle' (EAGLE-1) / 'eagle3') to the reason it
    cannot. An engine that `pairs_ngram` (llama.cpp) combines one n-gram drafter with one draft model or
    EAGLE-3 head (those two share its one draft slot); the others take one drafter."""
    title = engine.title
    members = drafter_members(drafter)
    chosen = Selection()
    reasons = []
    # an engine with one drafter gets the one that drafts on every step: a draft model or head
    # before early exit, and those before prompt lookup (which drafts only where the text repeats)
    ranked = sorted(enumerate(members), key=lambda item: _preference(item[1]))
    for i, member in ranked:
        where = f"drafter.{drafter.members_key}[{i}]" if drafter.drafters else "drafter"
        key, info, problem = _member_key(member, unsupported)
        label = _kind_name(member, info.kind if info else None)
        slot = SLOTS.get(member.kind)
        if problem or key in unsupported:
            reasons.append(f"{where} ({label}): {problem or unsupported[key]}")
            continue
        if slot is None:
            reasons.append(f"{where} ({label}): {title} has no drafter of kind {member.kind}")
            continue
        if engine.pairs_ngram:
            combinable = chosen.ngram is None if slot == "ngram" else (chosen.model is None and chosen.head is None)
        else:
            combinable = False
        if chosen.first() is not None and not combinable:
            kept = _kind_name(chosen.first(), chosen.eagle.kind if chosen.eagle else None)
            reasons.append(f"{where} ({label}): {title} runs one drafter; the chain's {kept} is written")
            continue
        setattr(chosen, slot, member)
        if slot == "head":
            chosen.eagle = info
    ngram = chosen.ngram
    # solo_ngram merges lookup's short matches with a later member's proposals
    solo = ngram.options.get("solo_ngram") if ngram is not None and ngram is not members[-1] else None
    if solo is not None and solo > ngram.options["min_ngram"]:
        reasons.append(f"drafter solo_ngram {solo} ({title} does not verify a shorter match's guess and another "
                       "drafter's in one tree)")
    if chosen.first() is None:
        raise NotCarriedError(f"{title} cannot carry profile drafter {drafter.describe()}: " + "; ".join(
            r.split(": ", 1)[1] for r in reasons))
    chosen.not_carried = reasons
    return chosen


# what to do instead of Medusa heads, where an engine cannot run them
MEDUSA_NEXT = "or train an EAGLE-3 head for this target (`specdec train-draft --kind eagle`)"


def head_notes(chosen: Selection) -> list[str]:
    """Header lines about the EAGLE head written: a folder that does not exist yet."""
    if chosen.eagle is None or not chosen.eagle.assumed:
        return []
    return [f"head folder {chosen.eagle.ref.name} does not exist here yet: written as an EAGLE-3 head, what "
            f"`specdec train-draft --kind eagle --out {chosen.eagle.ref.name}` writes there"]
