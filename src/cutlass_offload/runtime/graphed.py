"""Whole-model CUDA graphs: one capture per input signature, then replay.

Outside a graph every offloaded region pays its host path (Python, argument
mapping, ctypes launch: tens of microseconds per region on the H200 host,
benchmarks/runtime.py), which dominates models of many small regions such as BERT.
Replaying a captured graph launches all of them for a few microseconds in total.
This is what ``torch.cuda.make_graphed_callables`` and torch.compile's
"reduce-overhead" mode do; here the model is replayed per input signature with its
inputs copied into the graph's static buffers and its outputs cloned out, so a
result stays valid after the next call.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import DeviceError


class GraphedModel(torch.nn.Module):
    """Calls ``model`` through CUDA graphs, one per input signature.

    model: a CompiledModel (or any module whose forward can be captured).
    max_graphs: signatures kept (least recently used first out); each graph holds
      its static inputs, outputs and intermediate memory, shared through one pool.
    warmup: eager calls on a side stream before a capture (lazy initialisation:
      library loading, workspaces, cuBLAS handles, must happen outside the capture).

    Inputs: CUDA tensors (any shapes and dtypes the model takes) and non-tensor
    arguments, which are part of the signature. A new signature costs ``warmup``
    eager calls plus a capture; a repeated one copies the inputs, replays and
    clones the outputs. Verify mode (``CompiledModel.verify``) must have run its
    first call before graphing: its comparison synchronizes.

    Raises DeviceError for a CPU tensor input.
    """

    def __init__(self, model: torch.nn.Module, max_graphs: int = 8, warmup: int = 2):
        super().__init__()
        self.model = model
        self.max_graphs, self.warmup = max_graphs, warmup
        self._graphs = OrderedDict()     # signature -> (graph, static inputs, static outputs)
        self._pool = None
        self.captures = 0

    def forward(self, *args):
        sig = _signature(args)
        hit = self._graphs.get(sig)
        if hit is None:
            hit = self._capture(args)
            self._graphs[sig] = hit
            if len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(sig)
        graph, static_in, static_out = hit
        for dst, src in zip(static_in, args):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        graph.replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, static_out)

    def _capture(self, args):
        tensors = [a for a in tree_flatten(list(args))[0] if isinstance(a, torch.Tensor)]
        if any(not t.is_cuda for t in tensors):
            raise DeviceError("GraphedModel: every tensor input must be on a CUDA GPU")
        static_in = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.model(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = self.model(*static_in)
        self.captures += 1
        return graph, static_in, static_out


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                 else ("value", a) for a in args)
