"""Drafter kinds by name: the options each accepts (with defaults) and the module that builds it.

Kept free of torch so that reading and validating a profile stays instant; a drafter's module is
imported only when a decoder is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One drafter option: its type, default and lower bound (for ints and floats)."""

    type: type
    default: Any
    minimum: float | None = None
    choices: tuple | None = None
    required: bool = False


@dataclass(frozen=True)
class DrafterKind:
    module: str  # file under specdec_cli/drafters/, which defines build(spec, context)
    options: dict[str, Option] = field(default_factory=dict)
    takes_model: bool = False  # accepts the model keys (profile.MODEL_KEYS: model, dtype, quantize, ...)
    takes_drafters: bool = False  # holds a list of other drafters (a chain, auto's candidates)
    members_key: str = "drafters"  # the profile key that lists them
    summary: str = ""


REGISTRY: dict[str, DrafterKind] = {
    "model": DrafterKind(
        # its model keys include quantize (int8 / int4): exactness holds whatever q the draft
        # samples from, since the target verifies every token
        # vocab: shared (the target's tokenizer), intersect (the tokens both spell alike, any
        # temperature), text (the draft's text re-encoded, temperature 0), auto (shared if the
        # tokenizers match, else intersect): drafters/model_choice.py
        "model_choice", {"vocab": Option(str, "auto", choices=("auto", "shared", "intersect", "text"))},
        takes_model=True, summary="a smaller model, with the target's tokenizer or another",
    ),
    "ngram": DrafterKind(
        "ngram",
        # solo_ngram (in a chain): a match this long or longer is proposed alone; a shorter one
        # shares one tree with the next drafter's guesses (None: every match is proposed alone)
        # pool_tokens: the process's earlier and concurrent sequences searched too, this many
        # tokens at most (drafters/lookup_pool.py); 0: this sequence alone
        {"max_ngram": Option(int, 3, 1), "min_ngram": Option(int, 1, 1), "solo_ngram": Option(int, None, 1),
         "pool_tokens": Option(int, 100_000, 0)},
        summary="prompt lookup: copy what followed the latest n-gram seen before",
    ),
    "early-exit": DrafterKind(
        "early_exit",
        # None: a quarter of the target's layers, decided when the target is loaded
        {"layers": Option(int, None, 1)},
        summary="the target's own first layers, final norm and LM head",
    ),
    "medusa": DrafterKind(
        "medusa", {"heads": Option(str, None, required=True)},
        summary="Medusa heads over the target's last hidden state (specdec train-draft --kind medusa)",
    ),
    "eagle": DrafterKind(
        "eagle", {"head": Option(str, None, required=True)},
        summary="an EAGLE or EAGLE-3 layer drafting from the target's hidden states (train-draft --kind eagle)",
    ),
    "chain": DrafterKind(
        "chain", takes_drafters=True,
        summary="several drafters in order; the first that proposes wins (a weak lookup match shares its tree with the next)",
    ),
    "auto": DrafterKind(
        "auto", takes_drafters=True, members_key="candidates",
        summary="each step the candidate (or no draft) that has committed the most tokens a second so far",
    ),
}

# what a chain holds when a profile names none: both need no extra weights
DEFAULT_CHAIN = ({"kind": "ngram"}, {"kind": "early-exit"})
