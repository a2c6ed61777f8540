"""Tiny models and a tokenizer, built at test time and saved like real checkpoints (no network)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specdec_cli.models.progress_bars import no_progress_bars

# where the suite runs its models: `SPECDEC_TEST_DEVICE=cuda pytest` runs it on a GPU
# (benchmarks/gpu_check.sh); profiles written by conftest.write_profile say this device. Tests that
# are CPU-only by nature pin `device: cpu` themselves (the interrupt tests' profiles).
TEST_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def reverse(items):\n    return items[::-1]\n",
    "class Node:\n    def __init__(self, value, next=None):\n        self.value = value\n        self.next = next\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "Write a Python function that reverses a linked list.",
    "Summarise the following text in one sentence.",
    "import os\nimport sys\n\nprint(sys.argv)\n",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(folder: Path, vocab_size: int = 320, chat: bool = True):
    """A byte-level BPE trained on a few lines, with <s>, </s>, <pad> and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def decoder_config(config_class, tokenizer, layers: int, hidden: int, seed_std: float, tied: bool, extra: dict):
    """A tiny Llama-shaped decoder config (4 heads, 2 KV heads, MLP twice the width) for `tokenizer`."""
    return config_class(
        vocab_size=len(tokenizer) + extra.pop("vocab_padding", 0),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=extra.pop("max_positions", 512),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=seed_std,
        tie_word_embeddings=tied,
        **extra,
    )


def llama_config(tokenizer, layers: int = 4, hidden: int = 64, seed_std: float = 0.2, **extra):
    from transformers import LlamaConfig

    return decoder_config(LlamaConfig, tokenizer, layers, hidden, seed_std, False, extra)


def gpt2_config(tokenizer, layers: int = 3, hidden: int = 64, seed_std: float = 0.2, **extra):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer) + extra.pop("vocab_padding", 0),
        n_embd=hidden,
        n_layer=layers,
        n_head=4,
        n_positions=extra.pop("max_positions", 512),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=seed_std,
        **extra,
    )


def qwen2_config(tokenizer, layers: int = 2, hidden: int = 64, seed_std: float = 0.2):
    """Qwen2: biases on q/k/v, the head tied to the input embedding."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=seed_std, tie_word_embeddings=True,
        use_sliding_window=False,
    )


def build_model(config, seed: int):
    """Random weights from the CPU's generator (the same on every device), on the CPU."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def on_test_device(model):
    """A model built here, moved to the device under test (a no-op on the CPU)."""
    return model.to(TEST_DEVICE)


def noisy_copy(model, noise: float, seed: int):
    """The same weights plus Gaussian noise: a draft that agrees with the target often, not always."""
    import copy

    twin = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in twin.parameters():
            noise_sample = torch.randn(parameter.shape, generator=generator).to(parameter.device)
            parameter.add_(noise_sample * noise * parameter.std().clamp_min(1e-3))
    return twin


def save(model, tokenizer, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    with no_progress_bars():  # transformers' "Writing model shards" bar would land in a test's captured stderr
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_pair(target, tokenizer, root: Path, name: str, noise: float, seed: int) -> dict[str, Path]:
    """The target and its noisy copy as the draft (`noisy_copy`), saved as root/<name>-target and
    root/<name>-draft: a pair's {"target", "draft"} folders."""
    return {"target": save(target, tokenizer, root / f"{name}-target"),
            "draft": save(noisy_copy(target, noise, seed=seed), tokenizer, root / f"{name}-draft")}


WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]


def build_word_tokenizer(folder: Path):
    """12 tokens: <s>, </s>, <pad>, <unk> and eight words split on spaces (no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "<pad>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)
    return fast


# --------------------------------------------------------------------------- helpers for the hostile-input tests


def build_endless_model(tokenizer, folder: Path, hidden: int = 128, layers: int = 4, max_positions: int = 4096, seed: int = 21) -> Path:
    """A Llama with a long context whose greedy decoding never ends by itself, saved like a checkpoint.

    Its EOS row of the LM head is zero, so the EOS logit is 0 while the largest of the other 300-odd
    random logits is positive: greedy decoding runs to the context end, seconds on a CPU, which is
    time enough to interrupt it.
    """
    model = build_model(llama_config(tokenizer, layers=layers, hidden=hidden, max_positions=max_positions), seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id] = 0.0
    return save(model, tokenizer, folder)


def save_pickle_only(model, tokenizer, folder: Path) -> Path:
    """Saved like an old checkpoint: weights only in pytorch_model.bin (a pickle), no safetensors.

    transformers 5 always writes safetensors, so the state dict is pickled with torch.save afterwards.
    """
    save(model, tokenizer, folder)
    for weights in folder.glob("*.safetensors*"):
        weights.unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder
