"""Whether a draft can pair with a target: the same tokenizer (ids mean the same tokens), or the
target's tokenizer files byte for byte (then one tokenizer serves both)."""

from __future__ import annotations

import filecmp
import json

from ..errors import IncompatibleModelsError
from ..specs import ModelSpec
from .sources import is_local_reference, local_path

# the files AutoTokenizer reads from a folder to encode (tokenizer_config.json names the class); a
# chat_template.jinja beside them is left out: a draft's tokenizer never formats a chat
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def same_tokenizer_files(target: ModelSpec, draft: ModelSpec) -> bool:
    """Whether a draft's local folder holds the target's tokenizer files, byte for byte, with a
    tokenizer_config.json naming the class (a family's sizes usually do): then the target's loaded
    tokenizer serves the draft too (Qwen2.5's took 1.5 s to load and 0.8 s to check against the
    target's). Its chat template may differ: only the target's formats a prompt."""
    if not all(is_local_reference(spec.model) and not spec.gguf_file for spec in (target, draft)):
        return False
    folders = [local_path(spec.model) for spec in (target, draft)]
    config = folders[0] / TOKENIZER_FILES[0]
    try:
        if "tokenizer_class" not in json.loads(config.read_text()):
            return False
        return all(filecmp.cmp(folders[0] / name, folders[1] / name, shallow=False)
                   if (folders[0] / name).is_file() else not (folders[1] / name).exists() for name in TOKENIZER_FILES)
    except (OSError, ValueError):  # unreadable or absent: load each tokenizer, which says what is wrong
        return False


def check_tokenizers_match(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Draft ids must mean the same tokens as target ids: same ids for the same strings, same specials.

    Extra tokens past the smaller vocabulary's end are tolerated (padding tokens of a GGUF export);
    a token with a different id, or a missing one inside the shared range, is not.
    """
    if draft_tok is target_tok:  # one tokenizer loaded for both (same_tokenizer_files)
        return
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    shared_size = min(len(target_vocab), len(draft_vocab))
    problems = []
    for token, draft_id in draft_vocab.items():
        target_id = target_vocab.get(token)
        if target_id is None and draft_id < shared_size or target_id is not None and target_id != draft_id:
            problems.append((token, target_id, draft_id))
    if not problems:
        missing = [t for t, i in target_vocab.items() if i < shared_size and t not in draft_vocab]
        problems = [(t, target_vocab[t], None) for t in missing]
    if problems:
        token, t_id, d_id = problems[0]
        raise IncompatibleModelsError(
            f"draft '{draft_name}' and target '{target_name}' have different tokenizers "
            f"({len(problems)} tokens differ, e.g. {token!r}: id {t_id} in the target, {d_id} in the draft); "
            "a draft model must share the target's tokenizer"
        )
    for special in ("eos_token_id", "bos_token_id"):
        t_id, d_id = getattr(target_tok, special), getattr(draft_tok, special)
        if t_id is not None and d_id is not None and t_id != d_id:
            raise IncompatibleModelsError(
                f"draft '{draft_name}' and target '{target_name}' disagree on {special.removesuffix('_id')} "
                f"({d_id} vs {t_id})"
            )
