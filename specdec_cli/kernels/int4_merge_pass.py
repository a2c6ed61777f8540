"""The compiled step's half of int4_siblings.py: a graph pass that turns int4_linear calls on one
input, whose weights lie end to end in one buffer, into one call on the view that covers them all
and a split of its output.

It runs on inductor's joint graph, before freezing: there the weights are still the graph's inputs,
and their tensors show which share a buffer and where. The covering view is an as_strided of the
first call's weights, which freezing then folds into a constant, as it does the weights
themselves. So the merged graph holds no constant of its own making, and inductor's graph cache,
whose key is taken after freezing and reads the constants from the model at hand, serves it
safely to the next run. Unfrozen (an all-int4 model), the weights stay the graph's inputs and the
caches key on the pass's uuid, which holds the weights' layout. Its own module: importing inductor
takes a second that eager runs should not pay."""

from __future__ import annotations

import hashlib
import operator
from collections import defaultdict
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.multiprocessing.reductions import StorageWeakRef

WEIGHTS = (1, 2, 3, 5)  # int4_linear's packed, scales, mins and bias arguments


class MergeSiblings(CustomGraphPass):
    """int4_linear calls on one input whose weights lie end to end in memory, every part alike,
    become one call and a split of its output. `layout` (int4_siblings.layout_key of the model
    compiled) goes into the pass's uuid, which inductor's and AOTAutograd's caches key on: an
    unfrozen graph takes the weights as inputs, so a merged graph, whose views assume the
    weights' layout, must never be served to weights laid out otherwise."""

    def __init__(self, layout: str = "") -> None:
        self.layout = layout

    def __call__(self, graph: torch.fx.Graph) -> None:
        calls, order = defaultdict(list), {}
        for node in graph.nodes:
            order[node] = len(order)
            if node.target is torch.ops.specdec_kernels.int4_linear.default and _weights(node) is not None:
                calls[(node.args[0], node.args[4])].append(node)
        for group in calls.values():
            for run in _adjacent_runs(group):
                _merge(graph, run, min(run, key=order.get))

    def uuid(self) -> str:  # inductor's caches key on it: this file's text and the weights' layout
        return hashlib.sha256(Path(__file__).read_bytes() + self.layout.encode()).hexdigest()


def _weights(node: torch.fx.Node) -> list[torch.Tensor] | None:
    """The (fake) tensors of the call's weights, when the graph knows them all."""
    args = [node.args[i] for i in WEIGHTS]
    if not all(isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) for a in args):
        return None
    return [a.meta["val"] for a in args]


def _storage(tensor: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(tensor.untyped_storage())


def _adjacent_runs(group: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """The calls of `group` in runs of two or more whose weights follow each other in memory."""
    by_storage = defaultdict(list)
    for node in group:
        by_storage[_storage(_weights(node)[0])].append(node)
    runs = []
    for nodes in by_storage.values():
        nodes.sort(key=lambda node: _weights(node)[0].storage_offset())
        run = nodes[:1]
        for node in nodes[1:]:
            if all(_follows(before, after) for before, after in zip(_weights(run[-1]), _weights(node))):
                run.append(node)
            else:
                runs.append(run)
                run = [node]
        runs.append(run)
    return [run for run in runs if len(run) > 1]


def _follows(before: torch.Tensor, after: torch.Tensor) -> bool:
    if not before.numel() and not after.numel():  # no bias on either
        return True
    return (_storage(before) == _storage(after) and before.is_contiguous() and after.is_contiguous()
            and before.shape[1:] == after.shape[1:] and before.storage_offset() + before.numel() == after.storage_offset())


def _covering(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> torch.fx.Node:
    """A view from the first node's first row to the last node's last row (the first node itself
    where it is empty: no bias)."""
    first = nodes[0].meta["val"]
    if not first.numel():
        return nodes[0]
    size = (sum(node.meta["val"].shape[0] for node in nodes), *first.shape[1:])
    args = (nodes[0], size, first.stride(), first.storage_offset())
    view = graph.call_function(torch.ops.aten.as_strided.default, args)
    view.meta["val"] = first.as_strided(*args[1:])
    return view


def _merge(graph: torch.fx.Graph, run: list[torch.fx.Node], first: torch.fx.Node) -> None:
    """`run` (in the order of its weights in memory) becomes one call, placed where `first`, the
    earliest of them in the graph, was (their shared input comes before it)."""
    x, group_size = first.args[0], first.args[4]
    with graph.inserting_before(first):
        packed, scales, mins, bias = (_covering(graph, [node.args[i] for node in run]) for i in WEIGHTS)
        merged = graph.call_function(torch.ops.specdec_kernels.int4_linear.default,
                                     (x, packed, scales, mins, group_size, bias))
        sizes = [node.meta["val"].shape[-1] for node in run]
        merged.meta["val"] = x.meta["val"].new_empty((*x.meta["val"].shape[:-1], sum(sizes)))
        split = graph.call_function(torch.ops.aten.split_with_sizes.default, (merged, sizes, -1))
        split.meta["val"] = list(torch.split(merged.meta["val"], sizes, -1))
        pieces = [graph.call_function(operator.getitem, (split, index)) for index in range(len(run))]
    for node, piece, val in zip(run, pieces, split.meta["val"]):  # outside inserting_before: `first` goes too
        piece.meta["val"] = val
        node.replace_all_uses_with(piece)
        graph.erase_node(node)
