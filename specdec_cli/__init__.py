"""specdec: exact speculative decoding for local LLMs.

The Python API (the CLI is a thin layer over it):

    from specdec_cli import Pipeline
    pipe = Pipeline.from_profile("smollm2-demo", k=4)
    result = pipe.generate("Summarise: ...", seed=0)
    for event in pipe.stream("def add(a, b):"):
        ...   # Prefilled, Verified (accepted / rejected / corrected / bonus), Finished(stats)
    for result in pipe.generate_many(prompts, seed=0):
        ...   # in input order: a Generation, or a PromptError where that prompt cannot run
"""

from importlib import import_module
from importlib.metadata import version as _installed_version
from typing import TYPE_CHECKING, Any

__version__ = _installed_version("specdec-cli")  # pyproject's, as installed: said in one place

# Each public name and the module that defines it, imported at first use: `import specdec_cli`
# costs no torch, so the command line's --help, `profiles` and usage errors start at once.
_HOMES = {
    "DecodeStats": ".decoding.stats",
    "DrafterSpec": ".specs",
    "Finished": ".decoding.events",
    "Generation": ".api",
    "ModelSpec": ".specs",
    "Pipeline": ".api",
    "Prefilled": ".decoding.events",
    "Profile": ".specs",
    "ProfileError": ".errors",
    "PromptError": ".prompt_runs",
    "SamplingSpec": ".specs",
    "SpecdecError": ".errors",
    "SpeculativeDecoder": ".decoding.engine",
    "UsageError": ".errors",
    "Verified": ".decoding.events",
    "load_profile": ".profile",
    "with_overrides": ".profile",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'specdec_cli' has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported plainly
    from .api import Generation, Pipeline
    from .decoding.engine import SpeculativeDecoder
    from .decoding.events import Finished, Prefilled, Verified
    from .decoding.stats import DecodeStats
    from .errors import ProfileError, SpecdecError, UsageError
    from .profile import load_profile, with_overrides
    from .prompt_runs import PromptError
    from .specs import DrafterSpec, ModelSpec, Profile, SamplingSpec
