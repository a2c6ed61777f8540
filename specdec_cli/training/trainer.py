"""`specdec train-draft`: Medusa heads or an EAGLE-3 layer trained on a frozen target.

The target reads every training sequence once (its hidden states are kept, in float32, on the
CPU); the head is then trained on them:
- Medusa: head h at position t learns the token at t + 2 + h (cross-entropy through the target's
  own LM head's rows of the draft vocabulary, weighted 0.8^h as in Medusa); ResBlocks start at
  zero, i.e. as the identity.
- EAGLE-3: "training-time test" over `depth` steps, as EAGLE-3 trains: step 1 pairs the target's
  fused states at t with token t + 1 and learns token t + 2; step s feeds step s-1's output with
  token t + s and learns t + s + 1, attending to step 1's keys up to t and its own earlier steps at
  t (what a drafted node sees at inference). Losses weighted 0.8^(s-1). The LM head covers the
  draft vocabulary (mapped back with d2t) and starts as the target's own rows.
Both score a draft vocabulary (choose_draft_vocab): drafting and training then read a fraction of
the target's LM head.
Checkpoints (the published layout, plus training_state.pt for --resume) are written atomically
every `save_every` steps; a resumed run makes the same batches in the same order, so it ends
where an uninterrupted one would. Acceptance is measured on held-out prompts per draft depth.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..drafters.head_files import CONFIG, eagle_module, save_head, target_facts, text_config
from ..drafters.heads import EagleHead, MedusaHeads
from ..errors import UsageError
from ..files import interrupts_deferred, replace_atomically
from .distill import Sequence, key_of

STATE = "training_state.pt"
IGNORE = -100
DECAY = 0.8  # loss weight per depth (Medusa's lambda_k; EAGLE-3's step weights)


@dataclass(frozen=True)
class TrainSettings:
    kind: str  # "medusa" or "eagle" (written as EAGLE-3)
    depth: int = 4  # Medusa heads; EAGLE-3 training-time-test steps
    epochs: int = 3
    lr: float = 1e-3
    batch: int = 0  # Medusa: positions per step (0: 256); EAGLE: sequences per step (0: 4)
    seed: int = 0
    draft_vocab: int = 8192  # the draft vocabulary's size (Medusa and EAGLE-3); 0: the whole vocabulary
    save_every: int = 50

    @property
    def batch_size(self) -> int:
        return self.batch or (256 if self.kind == "medusa" else 4)


@dataclass
class Progress:
    """Where training stands: what a checkpoint records."""

    epoch: int = 0
    step_in_epoch: int = 0
    steps: int = 0
    losses: list[float] = field(default_factory=list)  # mean loss of each finished epoch
    epoch_loss: float = 0.0  # the sum of this epoch's step losses so far


# --------------------------------------------------------------------------- the target's states


def read_features(target: nn.Module, sequences: list[Sequence], layers: tuple[int, ...], advance: Callable[[int], None]) -> list[torch.Tensor]:
    """The target's hidden states at `layers` for every position of every sequence, [T, F] float32 on the CPU."""
    from ..models.properties import input_device
    from ..runtime.forward_parts import pick_features

    device = input_device(target)
    features = []
    with torch.inference_mode():
        for sequence in sequences:
            out = target(input_ids=torch.tensor([sequence.ids], device=device), output_hidden_states=True)
            features.append(pick_features(out.hidden_states, layers).float().cpu())
            advance(len(sequence.ids))
    return features


# --------------------------------------------------------------------------- Medusa


def medusa_table(sequences: list[Sequence], features: list[torch.Tensor], depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions as rows: the state at t [N, H] and the tokens at t + 2 + h [N, depth] (IGNORE
    outside the answer); only positions with at least one label."""
    rows, labels = [], []
    for sequence, feats in zip(sequences, features):
        ids = torch.tensor(sequence.ids)
        n = len(ids)
        table = torch.full((n, depth), IGNORE, dtype=torch.long)
        for h in range(depth):
            t = torch.arange(n)
            target_at = t + 2 + h
            ok = (target_at < n) & (target_at >= sequence.first_label)
            table[ok, h] = ids[target_at[ok]]
        keep = (table != IGNORE).any(dim=1)
        rows.append(feats[keep])
        labels.append(table[keep])
    return torch.cat(rows), torch.cat(labels)


def medusa_scores(heads: MedusaHeads, lm_head: nn.Module, feats: torch.Tensor, labels: torch.Tensor, to_draft: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy over the draft vocabulary (`to_draft`: target id -> draft id or -1;
    None: the whole vocabulary), and per row and depth whether the head's top token is right (a
    label outside the draft vocabulary is never learnt and always counts as wrong)."""
    if to_draft is None:
        logits = heads.logits(feats, lm_head).float()  # [N, depth, V]
    else:
        logits = heads.draft_logits(feats, lm_head).float()  # [N, depth, draft V]
        mapped = to_draft[labels.clamp_min(0)]
        labels = torch.where((labels == IGNORE) | (mapped < 0), torch.full_like(labels, IGNORE), mapped)
    weights = DECAY ** torch.arange(labels.shape[1], dtype=torch.float32, device=labels.device)
    losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")  # [N, depth]
    counted = (labels != IGNORE).float()
    loss = (losses * counted * weights).sum() / counted.sum().clamp_min(1)
    return loss, logits.argmax(-1) == labels


# --------------------------------------------------------------------------- EAGLE-3


def choose_draft_vocab(sequences: list[Sequence], limit: int, vocab: int, always: frozenset[int]) -> torch.Tensor:
    """`limit` target ids (0: all), ascending: EOS, the answers' tokens by frequency, then the
    lowest ids not yet in (a BPE vocabulary numbers its merges roughly by frequency, so other
    prompts' common tokens are not left out because the training answers never used them)."""
    if not limit or limit >= vocab:
        return torch.arange(vocab)
    counts = torch.zeros(vocab, dtype=torch.float64)
    for sequence in sequences:
        counts += torch.bincount(torch.tensor(sequence.ids[sequence.first_label :], dtype=torch.long), minlength=vocab)[:vocab].double()
    for token in always:
        if 0 <= token < vocab:
            counts[token] = counts.max() + 1
    counts -= torch.arange(vocab, dtype=torch.float64) / vocab  # unseen tokens: lowest id first
    return torch.sort(torch.topk(counts, limit).indices).values


def new_eagle3(target: nn.Module, draft_ids: torch.Tensor, seed: int) -> tuple[EagleHead, dict[str, Any]]:
    """A fresh EAGLE-3 layer for `target` and its config.json; the LM head starts as the target's rows."""
    config = text_config(target)
    facts = target_facts(target)
    head_config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": facts["hidden_size"],
        "intermediate_size": int(getattr(config, "intermediate_size", 4 * facts["hidden_size"])),
        "num_attention_heads": int(config.num_attention_heads),
        "num_key_value_heads": int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        "head_dim": int(getattr(config, "head_dim", None) or facts["hidden_size"] // config.num_attention_heads),
        "rms_norm_eps": float(getattr(config, "rms_norm_eps", 1e-6)),
        "max_position_embeddings": int(getattr(config, "max_position_embeddings", 4096)),
        "num_hidden_layers": 1,
        "vocab_size": facts["vocab_size"],
        "draft_vocab_size": int(draft_ids.numel()),
        "tie_word_embeddings": False,
    }
    rope = getattr(config, "rope_parameters", None)
    if rope:
        head_config["rope_parameters"] = dict(rope)
    elif getattr(config, "rope_theta", None):
        head_config["rope_theta"] = float(config.rope_theta)
    torch.manual_seed(seed)
    head = eagle_module(head_config, "eagle3", target, Path("(new head)"))
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids.to(target.device)].float().cpu())
        final_norm = getattr(target.get_decoder(), "norm", None) if hasattr(target, "get_decoder") else None
        if final_norm is not None and getattr(final_norm, "weight", None) is not None:
            head.norm.weight.copy_(final_norm.weight.float().cpu())
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        head.t2d.zero_()
        head.t2d[draft_ids] = True
    return head, head_config


def eagle_batch(sequences: list[Sequence], features: list[torch.Tensor], steps: int):
    """Padded tensors for a batch: ids [B, T + steps], states [B, T, F], lengths, first labels."""
    longest = max(len(s.ids) for s in sequences)
    ids = torch.zeros(len(sequences), longest + steps, dtype=torch.long)
    feats = torch.zeros(len(sequences), longest, features[0].shape[-1])
    for row, (sequence, state) in enumerate(zip(sequences, features)):
        ids[row, : len(sequence.ids)] = torch.tensor(sequence.ids)
        feats[row, : len(sequence.ids)] = state
    lengths = torch.tensor([len(s.ids) for s in sequences])
    first = torch.tensor([s.first_label for s in sequences])
    return ids, feats, lengths, first


def eagle_scores(head: EagleHead, embed: nn.Module, batch, steps: int, to_draft: torch.Tensor):
    """Training-time test over `steps` steps: the weighted loss, and per pair and step whether the
    top draft token is right ([B, n, steps], and where a label exists)."""
    ids, feats, lengths, first = batch
    b, n = ids.shape[0], feats.shape[1] - 1  # pair t: (state t, token t + 1), t = 0 .. n - 1
    t = torch.arange(n, device=ids.device)
    pair_ok = t[None, :] < (lengths[:, None] - 1)  # [B, n]
    causal = (t[None, :] <= t[:, None])[None] & pair_ok[:, None, :]  # [B, n(query), n(key)]
    diagonal = torch.eye(n, dtype=torch.bool, device=ids.device)[None].expand(b, n, n)
    hidden = head.project(feats[:, :n])
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []
    total = torch.zeros((), device=ids.device)
    right, labelled = [], []
    for step in range(1, steps + 1):
        mask = torch.cat([causal] + [diagonal] * (step - 1), dim=2)[:, None]  # [B, 1, n, step * n]

        def extend(k: torch.Tensor, v: torch.Tensor):
            keys.append((k, v))
            return torch.cat([kv[0] for kv in keys], dim=2), torch.cat([kv[1] for kv in keys], dim=2)

        embeds = embed(ids[:, step : step + n]).float()
        out = head.step(embeds, hidden, (t + step - 1)[None].expand(b, n), extend, mask)
        label_at = (t + step + 1)[None, :].expand(b, n)  # every row its own sequence's labels
        label = ids.gather(1, label_at.clamp_max(ids.shape[1] - 1))
        has = (label_at < lengths[:, None]) & (label_at >= first[:, None])
        draft_label = torch.where(has, to_draft[label], torch.full_like(label, IGNORE))
        draft_label = torch.where(draft_label < 0, torch.full_like(label, IGNORE), draft_label)
        logits = head.draft_logits(out).float()
        loss = F.cross_entropy(logits.transpose(1, 2), draft_label, ignore_index=IGNORE, reduction="sum")
        total = total + DECAY ** (step - 1) * loss / has.sum().clamp_min(1)
        right.append(logits.argmax(-1) == draft_label)
        labelled.append(has)
        hidden = out
    return total, torch.stack(right, -1), torch.stack(labelled, -1)


# --------------------------------------------------------------------------- acceptance per depth


def chain_acceptance(right: torch.Tensor, labelled: torch.Tensor) -> dict[str, Any]:
    """Greedy chain acceptance from per-position, per-depth correctness [N, D] (rows where every
    depth has a label): P(depth d kept | depths before kept), and tokens per target pass."""
    complete = labelled.all(dim=1)
    right = right[complete]
    if right.shape[0] == 0:
        return {"positions": 0, "per_depth": [], "tokens_per_pass": None}
    kept = right.long().cumprod(dim=1)  # kept[:, d]: depths 0..d all right
    reached = torch.cat([torch.ones(right.shape[0], 1, dtype=torch.long), kept[:, :-1]], dim=1)
    per_depth = [float(kept[:, d].sum() / reached[:, d].sum().clamp_min(1)) for d in range(right.shape[1])]
    return {
        "positions": int(right.shape[0]),
        "per_depth": [round(a, 4) for a in per_depth],
        "tokens_per_pass": round(1.0 + float(kept.sum(dim=1).float().mean()), 3),
    }


# --------------------------------------------------------------------------- the trainer


class Trainer:
    """One head's training on fixed sequences; `run` trains from `progress` to the last epoch."""

    def __init__(self, target: nn.Module, settings: TrainSettings, train: list[Sequence], held: list[Sequence],
                 train_features: list[torch.Tensor], held_features: list[torch.Tensor], eos_ids: frozenset[int]):
        self.target = target
        self.settings = settings
        self.train, self.held = train, held
        self.lm_head = target.get_output_embeddings()
        self.embed = target.get_input_embeddings()
        facts = target_facts(target)
        self.data_key = key_of([s.ids for s in train], [s.first_label for s in train])
        draft_ids = choose_draft_vocab(train, settings.draft_vocab, facts["vocab_size"], eos_ids)
        whole = draft_ids.numel() == facts["vocab_size"]
        self.to_draft = torch.full((facts["vocab_size"],), -1, dtype=torch.long)
        self.to_draft[draft_ids] = torch.arange(draft_ids.numel())
        if settings.kind == "medusa":
            self.head: nn.Module = MedusaHeads(
                settings.depth, 1, facts["hidden_size"], facts["vocab_size"], own_lm_heads=False, draft_ids=None if whole else draft_ids
            )
            with torch.no_grad():
                for block in self.head.heads:
                    nn.init.zeros_(block[0].linear.weight)  # ResBlock = identity: head 0 starts as the LM head
                    nn.init.zeros_(block[0].linear.bias)
            self.config = {"medusa_num_heads": settings.depth, "medusa_num_layers": 1, "draft_vocab_size": int(draft_ids.numel())}
            self.rows, self.labels = medusa_table(train, train_features, settings.depth)
            self.held_rows, self.held_labels = medusa_table(held, held_features, settings.depth)
        else:
            self.head, self.config = new_eagle3(target, draft_ids, settings.seed)
            self.feature_scale = input_scale(torch.cat(train_features))
            # fc trains on standardised states; the scale is folded into its weight when saved
            self.train_features = [f * self.feature_scale for f in train_features]
            self.held_features = [f * self.feature_scale for f in held_features]
        from ..models.properties import input_device

        self.device = input_device(target)  # trained where the profile runs the target
        self.head = self.head.float().to(self.device)
        # a bf16 target (a CPU with AVX512-BF16, a GPU) trains under bf16 autocast: the frozen LM
        # head's matmul over the whole vocabulary is most of Medusa's cost; the head's weights,
        # its optimizer and the loss stay in float32
        dtype = self.lm_head.weight.dtype
        self.autocast = dtype == torch.bfloat16 or (dtype == torch.float16 and self.device.type == "cuda")
        frozen_dtype = dtype if self.autocast else torch.float32
        self.lm_head_copy = copy_frozen(self.lm_head, self.device, frozen_dtype)
        self.embed_copy = copy_frozen(self.embed, self.device, frozen_dtype)
        trainable = [p for p in self.head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=0.0)

    # --- batches
    def batches_per_epoch(self) -> int:
        count = self.rows.shape[0] if self.settings.kind == "medusa" else len(self.train)
        return max(1, math.ceil(count / self.settings.batch_size))

    def order(self, epoch: int) -> torch.Tensor:
        count = self.rows.shape[0] if self.settings.kind == "medusa" else len(self.train)
        return torch.randperm(count, generator=torch.Generator().manual_seed(self.settings.seed * 100_003 + epoch))

    def scores(self, index: torch.Tensor, held: bool = False):
        """(loss, right [N, D], labelled [N, D], label tokens) for the rows/sequences `index`."""
        with torch.autocast(self.device.type, dtype=self.lm_head.weight.dtype, enabled=self.autocast):
            return self._scores(index, held)

    def _scores(self, index: torch.Tensor, held: bool):
        if self.settings.kind == "medusa":
            rows, labels = (self.held_rows, self.held_labels) if held else (self.rows, self.labels)
            labels = labels[index].to(self.device)
            to_draft = None if self.head.draft_ids is None else self.to_draft.to(self.device)
            loss, right = medusa_scores(self.head, self.lm_head_copy, rows[index].to(self.device), labels, to_draft)
            labelled = labels != IGNORE
            return loss, right.cpu(), labelled.cpu(), int(labelled.sum())
        sequences = self.held if held else self.train
        features = self.held_features if held else self.train_features
        chosen = [sequences[i] for i in index.tolist()]
        batch = [tensor.to(self.device) for tensor in eagle_batch(chosen, [features[i] for i in index.tolist()], self.settings.depth)]
        loss, right, labelled = eagle_scores(self.head, self.embed_copy, batch, self.settings.depth, self.to_draft.to(self.device))
        d = right.shape[-1]
        return loss, right.reshape(-1, d).cpu(), labelled.reshape(-1, d).cpu(), int(labelled[..., 0].sum())

    def acceptance(self, held: bool) -> dict[str, Any]:
        """Chain acceptance per depth on the held-out sequences, or on as many training ones."""
        if self.settings.kind == "medusa":
            count = self.held_rows.shape[0] if held else min(self.rows.shape[0], max(1, self.held_rows.shape[0]))
        else:
            count = len(self.held) if held else min(len(self.train), max(1, len(self.held)))
        if count == 0:
            empty = torch.zeros(0, self.settings.depth, dtype=torch.bool)
            return chain_acceptance(empty, empty)
        rights, labels = [], []
        with torch.no_grad():
            for start in range(0, count, self.settings.batch_size):
                _, right, labelled, _ = self.scores(torch.arange(start, min(count, start + self.settings.batch_size)), held=held)
                rights.append(right)
                labels.append(labelled)
        return chain_acceptance(torch.cat(rights), torch.cat(labels))

    # --- training
    def run(self, progress: Progress, save: Callable[[Progress], None], tick: Callable[[float, int], None]) -> Progress:
        """Train from `progress` to the last epoch; `save` every save_every steps and at each
        epoch's end; `tick(loss, tokens)` after every step."""
        per_epoch = self.batches_per_epoch()
        size = self.settings.batch_size
        self.head.train()
        while progress.epoch < self.settings.epochs:
            order = self.order(progress.epoch)
            for step in range(progress.step_in_epoch, per_epoch):
                loss, _, _, tokens = self.scores(order[step * size : (step + 1) * size])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
                self.optimizer.step()
                progress.epoch_loss += float(loss.detach())
                progress.step_in_epoch = step + 1
                progress.steps += 1
                tick(float(loss.detach()), tokens)
                if progress.steps % self.settings.save_every == 0 and step + 1 < per_epoch:
                    save(progress)
            progress.losses.append(progress.epoch_loss / per_epoch)
            progress.epoch += 1
            progress.step_in_epoch, progress.epoch_loss = 0, 0.0
            save(progress)
        self.head.eval()
        return progress

    # --- checkpoints
    def state(self, progress: Progress, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "head": self.head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": asdict(progress),
            "settings": asdict(self.settings),
            "data_key": self.data_key,
            **extra,
        }

    def restore(self, state: dict[str, Any], folder: Path) -> Progress:
        if state.get("settings") != asdict(self.settings) or state.get("data_key") != self.data_key:
            saved = state.get("settings") or {}
            differ = [k for k in asdict(self.settings) if saved.get(k) != getattr(self.settings, k)]
            what = f"options ({', '.join(differ)})" if differ else "training data"
            raise UsageError(f"--resume: the checkpoint in '{folder}' was trained with other {what}; use the same ones, or --overwrite to start over")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        return Progress(**state["progress"])

    def save(self, folder: Path, progress: Progress, meta: dict[str, Any], dtype: torch.dtype) -> None:
        """The training state first, then the head in its published layout (the target's dtype)."""
        state = self.state(progress, {"meta": meta})
        folder.mkdir(parents=True, exist_ok=True)
        shipped = copy.deepcopy(self.head).to(dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32)
        if isinstance(shipped, EagleHead):  # fc reads the target's raw states: fold the standardisation in
            with torch.no_grad():
                shipped.fc.weight.mul_(self.feature_scale.to(shipped.fc.weight))
        with interrupts_deferred():  # a Ctrl-C mid-save would leave a state without its head
            replace_atomically(folder / STATE, lambda path: torch.save(state, path))
            save_head(shipped, folder, {**self.config, "specdec": meta})


def input_scale(features: torch.Tensor) -> torch.Tensor:
    """1 / each channel's RMS over the training data: fc is trained on standardised states. The
    target's middle layers carry "massive activations" (SmolLM2-135M: one channel near 25,000
    where the others are near 4): read raw, they swamp the head's attention and Adam's equal-size
    steps on those weights make training diverge (measured: held-out acceptance 2-4% after 8
    epochs). The saved fc weight has the scale folded in, so layout and inference are unchanged."""
    return 1.0 / features.float().pow(2).mean(dim=0).sqrt().clamp_min(1e-3)


def copy_frozen(module: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A copy of a target module whose weights training never changes."""
    frozen = copy.deepcopy(module).to(device=device, dtype=dtype)
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    return frozen


def load_state(folder: Path) -> dict[str, Any]:
    path = folder / STATE
    if not path.is_file():
        raise UsageError(f"--resume: '{folder}' holds no {STATE} to continue from; leave out --resume to start")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a damaged file: torch raises several kinds
        raise UsageError(f"--resume: cannot read '{path}' ({type(error).__name__}); --overwrite starts over") from error


def check_out_folder(folder: Path, resume: bool, overwrite: bool) -> None:
    """Never train over a head the user has without being told to."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite contradict each other; give one")
    holds_head = folder.is_dir() and ((folder / CONFIG).exists() or (folder / STATE).exists())
    if holds_head and not (resume or overwrite):
        raise UsageError(f"--out: '{folder}' already holds a head; --resume continues its training, --overwrite starts over")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out: '{folder}' is a file; give a folder")
