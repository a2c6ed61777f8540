"""The static KV cache: preallocated, position-indexed buffers [1, kv_heads, capacity, head_dim] as a
transformers Cache (a forward of n tokens writes token i at slot length + i; rolling back is moving
the length), and which models it serves."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer, get_layer_types_and_kwargs

MIN_CAPACITY = 256  # cache capacities are powers of two from here


class StaticCacheUnsupported(Exception):
    """The model's cache layout is not one this static cache serves (sliding windows, linear attention)."""


def _layer_types(config) -> list[str]:
    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return list(layer_types)[: config.num_hidden_layers]


def check_supported(config) -> None:
    kinds = set(_layer_types(config))
    if kinds != {"full_attention"}:
        raise StaticCacheUnsupported(f"layer types {sorted(kinds)}: only full attention is served")


def check_one_device(model: torch.nn.Module) -> None:
    """A model spread over several devices (device_map: auto) would need the cache positions and
    mask on each of them; the static cache keeps one copy, on the input device."""
    placement = getattr(model, "hf_device_map", None) or {}
    devices = {str(device) for device in placement.values()}
    if len(devices) > 1:
        raise StaticCacheUnsupported(f"it is spread over {len(devices)} devices ({', '.join(sorted(devices))})")


class PositionedLayer(StaticLayer):
    """A StaticLayer that writes the new keys/values at the cache's `positions`, not at a running count."""

    def __init__(self, max_cache_len: int, owner: "PositionedCache"):
        super().__init__(max_cache_len=max_cache_len)
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.device.type == "cuda":
            return super().lazy_initialization(key_states, value_states)  # static addresses, for CUDA graphs
        # elsewhere plain buffers: under freezing a static address makes a tensor a graph constant,
        # and a new cache (another LM, a larger capacity) would be read as the first one
        self.device = key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        shape = (self.batch_size, self.num_heads, self.max_cache_len)
        self.keys = torch.zeros(*shape, self.k_head_dim, dtype=key_states.dtype, device=self.device)
        self.values = torch.zeros(*shape, self.v_head_dim, dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        positions = self.owner.positions
        self.keys.index_copy_(2, positions, key_states)
        self.values.index_copy_(2, positions, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # the mask spans every slot; its width is read off the buffer, so that the capacity stays a
        # dynamic dimension of the compiled graph (max_cache_len, an int, would be baked in)
        return (self.max_cache_len if self.keys is None else self.keys.shape[-2]), 0

    def get_seq_length(self):
        # the mask's query offset: a tensor inside a compiled graph (no guard on its value), the
        # host's int in eager mode (no device read)
        if torch.compiler.is_compiling():
            return self.owner.positions[0]
        return self.owner.start


class PositionedCache(Cache):
    """A transformers Cache of `capacity` slots per layer; a forward writes its tokens at `positions`."""

    def __init__(self, config, capacity: int):
        check_supported(config)
        self.positions: torch.Tensor | None = None  # slots of this forward's tokens, on the device
        self.start = 0  # host copy of positions[0], for eager forwards
        super().__init__(layers=[PositionedLayer(capacity, self) for _ in range(config.num_hidden_layers)])


def capacity_for(positions: int) -> int:
    """The cache capacity for `positions` slots: a power of two, at least MIN_CAPACITY."""
    capacity = MIN_CAPACITY
    while capacity < positions:
        capacity *= 2
    return capacity


class RowsLayer(StaticLayer):
    """A layer of [rows, kv_heads, capacity, head_dim] buffers (allocated by its owner) in which each
    row writes its new keys/values at its own slots: the owner's `slots` [rows, T]."""

    def __init__(self, owner: "RowsCache"):
        super().__init__(max_cache_len=0)
        self.owner = owner

    def hold(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values
        self.device = keys.device
        self.batch_size, self.num_heads, self.max_cache_len, self.k_head_dim = keys.shape
        self.v_head_dim = values.shape[-1]
        self.is_initialized = True
        if keys.device.type == "cuda":  # static addresses, for CUDA graphs (until the rows are reallocated)
            torch._dynamo.mark_static_address(keys)
            torch._dynamo.mark_static_address(values)

    def update(self, key_states, value_states, *args, **kwargs):
        slots = self.owner.slots[:, None, :, None]
        self.keys.scatter_(2, slots.expand(-1, key_states.shape[1], -1, key_states.shape[3]), key_states)
        self.values.scatter_(2, slots.expand(-1, value_states.shape[1], -1, value_states.shape[3]), value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0

    def get_seq_length(self):
        return 0  # never read: every forward gives its position ids and its 4D mask


class RowsCache(Cache):
    """A transformers Cache of rows, each written at its own `slots` (runtime/batched_static.py)."""

    def __init__(self, config, buffers: list[tuple[torch.Tensor, torch.Tensor]]):
        check_supported(config)
        self.slots: torch.Tensor | None = None  # [rows, T]: where each row's new tokens go, on the device
        super().__init__(layers=[RowsLayer(self) for _ in buffers])
        for layer, (keys, values) in zip(self.layers, buffers):
            layer.hold(keys, values)
