"""A dry run of one profile: the same generations for real on the CPU (recording the host reads),
then on fake CUDA (replaying them), checked by fake_cuda's watches."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch
from fake_cuda import FAKE_GPU, RecordingRuntime, loaded_on_cpu, on_fake_cuda, read_for_real, steady_clock
from profile_helpers import write_profile

import specdec_cli.api as api
from specdec_cli.drafters import head_files
from specdec_cli.primitives import device_calls

TREE = {"nodes": 8, "width": 2, "depth": 4}
PROMPTS = ["def add(a, b):", "class Stack:\n    def push(self, item):", "for i in range(10):"]


def generations(profile: Path, prompts: list[str], batch_size: int, options: dict[str, Any],
                decoding: Callable[[], None] = lambda: None) -> tuple[api.Pipeline, list]:
    """The pipeline of `profile` and its tokens for `prompts`; `decoding()` is called once it has loaded."""
    pipe = api.Pipeline.from_profile(str(profile))
    decoding()
    if options.pop("plain", False):  # the profile's drafter set aside: plain decoding, the same core
        options["decoder"] = pipe.decoder(drafter=None)
    if batch_size == 1 and len(prompts) == 1:
        return pipe, [pipe.generate(prompts[0], **options)]
    return pipe, list(pipe.generate_many(prompts, batch_size=batch_size, **options))


def dry_run(folder: Path, target: Path, fields: dict[str, Any], *, batch_size: int = 1, prompts: list[str] | None = None,
            dtype: str = "bfloat16", watch_decode: bool = True, static: bool | str = False, quantize: str = "none",
            **options: Any) -> dict[str, Any]:
    """The profile (`fields` beside the target) run on the CPU in `dtype`, then on fake CUDA with
    `device: auto` and `dtype: auto` (the stand-in GPU supports bf16; fp16 runs name it); the fake
    run's tokens, which replayed reads make the CPU run's, and what the watches found. `static`:
    `compile: on` with torch.compile stood in by the uncompiled step (fake tensors cannot be
    compiled for a GPU that is not there): the static caches and the compiled loop's code, eager;
    "try": the fake run calls the real compiler, which fails there as a broken GPU stack would."""
    prompts = prompts or PROMPTS[: batch_size if batch_size > 1 else 1]
    if static:
        fields = {**fields, "compile": "on"}

    def compiler(run_on_fake: bool):
        stood_in = static is True or (static == "try" and not run_on_fake)
        return mock.patch.object(torch, "compile", lambda step, **_: step) if stood_in else contextlib.nullcontext()

    options.setdefault("max_new_tokens", 10)
    options.setdefault("seed", 3)
    cpu = write_profile(folder, "dry-cpu", device="cpu", target={"model": str(target), "dtype": dtype, "quantize": quantize},
                        **fields)
    cuda_dtype = "auto" if dtype == "bfloat16" else dtype
    cuda = write_profile(folder, "dry-cuda", device="auto", **fields,
                         target={"model": str(target), "dtype": cuda_dtype, "quantize": quantize})
    recorder = RecordingRuntime()
    with compiler(False), steady_clock(), device_calls.standing_in(recorder):
        _, real = generations(cpu, prompts, batch_size, dict(options))
    with compiler(True), steady_clock(), mock.patch.object(api, "load_model", loaded_on_cpu(api.load_model)), \
            mock.patch.object(head_files, "read_weights", read_for_real(head_files.read_weights)), \
            on_fake_cuda(recorder.reads, FAKE_GPU) as (runtime, watch), \
            mock.patch.object(head_files, "load_head", watch.loading(head_files.load_head)):
        pipe, fake = generations(cuda, prompts, batch_size, dict(options),
                                 decoding=lambda: setattr(watch, "decoding", watch_decode))
    assert runtime.taken == len(recorder.reads), f"the fake run read {runtime.taken} of the CPU run's {len(recorder.reads)}"
    return {"real": [g.token_ids for g in real], "fake": [g.token_ids for g in fake], "found": sorted(set(watch.found)),
            "reads": len(recorder.reads), "device_reads": runtime.device_reads, "steps": [len(g.stats.steps) for g in fake],
            "k_limit": fake[0].stats.k_limit,
            "device": pipe.device, "dtype": next(pipe.target.parameters()).dtype, "compile": pipe.compile}


def run(tmp_path: Path, llama_pair, fields: dict, **options) -> dict:
    """dry_run on llama_pair's target, checked: nothing found, the tokens replayed, the device CUDA."""
    result = dry_run(tmp_path, llama_pair["target"], fields, **options)
    assert result["found"] == []
    assert result["fake"] == result["real"]  # the replayed reads make the CPU run's tokens
    assert result["device"].type == "cuda"
    return result
