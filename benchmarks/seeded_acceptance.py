"""What the seeded sampling costs in acceptance: per generated position, the chance that a sampling
drafter's token is kept under the two exact rules.

- the rejection rule (Leviathan et al.; specdec before seeded sampling): sum_x min(p(x), q(x)) = 1 - TV(p, q);
- the shared-noise race specdec uses now (token = argmax(p / e), the drafter's argmax(q / e) with the
  same Exp(1) noise e): P(agree) = sum_x 1 / sum_y max(p(y)/p(x), q(y)/q(x)), exact (integrate the
  race over e_x); computed over the tokens with min(p(x), q(x)) > 1e-6, so it is a lower bound short
  by at most the mass printed as "cut".

A deterministic drafter (prompt lookup, greedy heads) loses nothing: both rules keep its token with
probability p(token). The positions are those of a text sampled from the target (the positions the
target's own text visits), scored by both models in one forward each.

usage: python benchmarks/seeded_acceptance.py TARGET_DIR DRAFT_DIR QUESTIONS.jsonl [prompts] [tokens] [temperature]
"""
import json
import statistics
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec_cli.primitives.sampling import fit_vocab, probabilities
from specdec_cli.specs import SamplingSpec

target_dir, draft_dir, questions = sys.argv[1:4]
n_prompts = int(sys.argv[4]) if len(sys.argv) > 4 else 13
n_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 64
temperature = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
sampling = SamplingSpec(temperature=temperature)

tokenizer = AutoTokenizer.from_pretrained(target_dir)
target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
vocab = len(tokenizer)

rows, seen = [], set()
with open(questions, encoding="utf-8") as f:
    for line in f:  # one prompt per category first, then the rest in file order
        row = json.loads(line)
        if row["category"] not in seen:
            seen.add(row["category"])
            rows.append(row)
rows = rows[:n_prompts]


def race_agreement(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    both = torch.minimum(p, q)
    keep = (both > 1e-6).nonzero().squeeze(1)
    total = 0.0
    for chunk in keep.split(256):  # [256, V] at a time: the support can be thousands of tokens
        ratios = torch.maximum(p[None, :] / p[chunk, None], q[None, :] / q[chunk, None])
        total += float((1.0 / ratios.sum(dim=1)).sum())
    return total, float(both.sum() - both[keep].sum())


rejection, agreement, cut = [], [], []
generator = torch.Generator().manual_seed(0)
with torch.inference_mode():
    for row in rows:
        chat = [{"role": "user", "content": row["turns"][0]}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        start = ids.shape[1]
        out = target(ids, use_cache=True)
        for _ in range(n_tokens):  # the target's own sampled text
            p = probabilities(fit_vocab(out.logits[0, -1], vocab), sampling)
            token = torch.multinomial(p, 1, generator=generator)[None]
            ids = torch.cat([ids, token], dim=1)
            out = target(token, past_key_values=out.past_key_values, use_cache=True)
        p_all = probabilities(fit_vocab(target(ids).logits[0, start - 1:-1], vocab), sampling)
        q_all = probabilities(fit_vocab(draft(ids).logits[0, start - 1:-1], vocab), sampling)
        for p, q in zip(p_all, q_all):
            rejection.append(float(torch.minimum(p, q).sum()))
            agree, missing = race_agreement(p, q)
            agreement.append(agree)
            cut.append(missing)
        print(f"{row['category']:15s} 1-TV {statistics.mean(rejection[-n_tokens:]):.3f}  "
              f"race {statistics.mean(agreement[-n_tokens:]):.3f}", flush=True)

mean_rej, mean_race = statistics.mean(rejection), statistics.mean(agreement)
print(f"\n{len(rows)} prompts x {n_tokens} positions, temperature {temperature}")
print(f"rejection rule (1 - TV): mean {mean_rej:.3f}")
print(f"shared-noise race:       mean {mean_race:.3f}  (cut <= {max(cut):.4f} a position)")
print(f"ratio race / rejection:  {mean_race / mean_rej:.3f}")
print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability())
