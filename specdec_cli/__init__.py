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

from importlib.metadata import version as _installed_version

from .api import Generation, Pipeline
from .decoding.engine import SpeculativeDecoder
from .decoding.events import Finished, Prefilled, Verified
from .decoding.stats import DecodeStats
from .errors import ProfileError, SpecdecError, UsageError
from .profile import load_profile, with_overrides
from .prompt_runs import PromptError
from .specs import DrafterSpec, ModelSpec, Profile, SamplingSpec

__version__ = _installed_version("specdec-cli")  # pyproject's, as installed: said in one place

__all__ = [
    "DecodeStats",
    "DrafterSpec",
    "Finished",
    "Generation",
    "ModelSpec",
    "Pipeline",
    "Prefilled",
    "Profile",
    "ProfileError",
    "PromptError",
    "SamplingSpec",
    "SpecdecError",
    "SpeculativeDecoder",
    "UsageError",
    "Verified",
    "load_profile",
    "with_overrides",
]
