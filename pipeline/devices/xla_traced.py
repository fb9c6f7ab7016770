"""The forward, loss and backward of the XLA training step traced once per input shape, not at every step.

torch_xla builds the step's graph by running it in Python with lazy tensors, every step again: for ECAPA-TDNN
the forward and the autograd engine's backward were ~60 % of the host's trace (benchmarks/xla_step.py),
while the TPU waited. The arithmetic of those phases depends only on the weights, the BatchNorm buffers and
the batch, so it is traced once, on placeholder tensors, into an XLA computation (torch_xla's lowering
context), and every later step calls that computation as one operation of its graph: the same HLO, hence the
same numbers, and the same graph for the compiler (still two compiles per input shape). This is what
torch_xla's own `gradient_accumulation` and `scan` do, and what `experimental.assume_pure` does through
JAX, without JAX (not on Kaggle's TPU image), and with the backward and the BatchNorm updates inside.

The computation returns the loss, the gradients as one flat vector (the flat Adam's input: no flatten of
~140 gradients per step) and the BatchNorm buffers after the step, copied back into the model's.

What a traced function may not do is change between calls other than through its tensor inputs: a Python
number used inside becomes a constant of the computation. The forward of this project's models has no
randomness and no data-dependent Python (the tracer refuses a random operation); whatever else the key
below does not cover (a different loss function or mode) gets a trace of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._utils import _flatten_dense_tensors as flatten

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class NotTraceable(RuntimeError):
    """The step cannot be one computation traced once; the caller traces it at every step instead."""


@dataclass
class _Traced:
    computation: object  # torch_xla's XlaComputation
    inputs: list[int | None]  # per computation parameter: index into the step's inputs, or None (a constant)
    constants: dict[int, torch.Tensor]  # computation parameter -> device data captured while tracing
    written: list[torch.Tensor]  # the model's buffers the step writes (BatchNorm's), in output order


class TracedGradients:
    """`(loss, flat gradient)` of `model` on a batch, BatchNorm buffers updated in place, from one XLA
    computation per (input shapes, mode, autocast, loss function); `model` is on the XLA device."""

    def __init__(self, model: torch.nn.Module) -> None:
        import torch_xla
        import torch_xla.core.xla_builder as xb

        self._torch_xla, self._xb = torch_xla, xb
        self.model = model
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
        buffers = dict(model.named_buffers())
        # The flat gradient's order: model.parameters(), the trainable ones.
        self.params = list(trainable.values())
        self.buffers = list(buffers.values())
        self._state = {**trainable, **frozen, **buffers}  # the step's inputs after the batch, by name
        self._traced: dict[tuple, _Traced] = {}

    @property
    def traces(self) -> int:
        return len(self._traced)

    def __call__(
        self,
        loss_fn: Loss,
        inputs: torch.Tensor,
        lens: torch.Tensor,
        labels: torch.Tensor,
        autocast: Callable,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step_inputs = [inputs, lens, labels, *self._state.values()]
        with autocast():
            cast = (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"))
        key = (*((tuple(t.shape), t.dtype) for t in step_inputs[:3]), self.model.training, cast, loss_fn)
        if (traced := self._traced.get(key)) is None:
            traced = self._traced[key] = self._trace(loss_fn, step_inputs, autocast)
        arguments = [
            step_inputs[i] if i is not None else traced.constants[p] for p, i in enumerate(traced.inputs)
        ]
        loss, gradient, *buffers = self._torch_xla._XLAC._xla_user_computation(
            "xla::traced_gradients", arguments, traced.computation
        )
        if buffers:
            with torch.no_grad():
                torch._foreach_copy_(traced.written, buffers)
        return loss, gradient

    def _trace(self, loss_fn: Loss, step_inputs: list[torch.Tensor], autocast: Callable) -> _Traced:
        xb, xlac = self._xb, self._torch_xla._XLAC
        placeholders = [xb.create_placeholder_tensor(t.shape, t.dtype) for t in step_inputs]
        inputs, lens, labels, *tensors = placeholders
        params = [p.requires_grad_(True) for p in tensors[: len(self.params)]]
        # BatchNorm updates its running statistics in place: on copies, so that the placeholders themselves stay
        # the computation's parameters (a placeholder written in place would be captured as a constant).
        n_weights = len(tensors) - len(self.buffers)
        buffers = [b.clone() for b in tensors[n_weights:]]
        state = dict(zip(self._state, [*tensors[:n_weights], *buffers], strict=True))
        before = [xlac._get_graph_hash([b]) for b in buffers]
        with torch.enable_grad():
            with autocast():
                scores = torch.func.functional_call(
                    self.model, state, (inputs, lens), {"features_ready": True}
                )
            loss = loss_fn(scores, labels)
            gradients = torch.autograd.grad(loss, params)
        # Only the buffers the step wrote in place (BatchNorm's statistics: their lazy graph changed) are
        # outputs. A constant one (the Fbank's delta kernel) returned too was written back at every step, and
        # whether torch_xla may donate its device buffer to that write depends on what else holds it: after a
        # validation the weight average's copy did, and the next step compiled a second graph for that alone.
        # (Not the version counter: BatchNorm's in-place update of its statistics on XLA leaves it as it was.)
        updated = [
            i for i, (b, h) in enumerate(zip(buffers, before, strict=True)) if xlac._get_graph_hash([b]) != h
        ]
        outputs = [loss.detach().float(), flatten(gradients), *(buffers[i] for i in updated)]
        context = xlac.lowering.LoweringContext("TracedGradients")
        context.set_name_string("traced_gradients")
        context.build(outputs)
        # A random number drawn inside would be drawn from the seed it had while tracing, at every step.
        if re.search(r'opcode: "rng', context.hlo_text()):
            raise NotTraceable("the training step draws random numbers on the XLA device")
        computation = xb.computation_from_module_proto("xla::traced_gradients", context.hlo())
        constants = dict(context.device_parameter_id_tensor_mapping())
        positions: list[int | None] = [None] * len(constants)
        for index, placeholder in enumerate(placeholders):
            parameter = context.tensor_parameter_id(placeholder)
            if parameter != -1:
                positions[parameter] = index
                del constants[parameter]
        return _Traced(computation, positions, constants, [self.buffers[i] for i in updated])
