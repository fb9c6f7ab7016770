"""An exponential moving average (EMA) of the weights: what training validates, keeps and saves.

With the learning rates the batch scaling produces, validation accuracy swings by several points from one epoch
to the next (FSDD digits: 0.98 -> 0.84 -> 0.90 at epochs 3-5). Averaging the weights over the last epoch or so
removes most of that noise for the price of one parameter copy, so the epoch picked as "best" is a good model
and not a lucky one. BatchNorm running statistics are averaged the same way (or, when training recomputes them
before validation, as it does by default, copied); integer buffers are copied.

Averaged statistics do not belong to the averaged weights, though, and neither do a live model's running
statistics (a momentum average over earlier weights). `recompute_batchnorm` gives the weights that are
validated and saved their own statistics, from a fixed set of training windows ("precise BatchNorm", as
SWA's `update_bn` does). On FSDD speakers that turned a validation curve with dips to 0.52 into one that stays
at 0.98-1.0 from epoch 3 on.

The decay follows the run's length (`horizon_steps`, about one epoch) and ramps up over the first steps
(`(1 + n) / (10 + n)`, as in TensorFlow's ExponentialMovingAverage), so a short run is not dominated by its
random initialisation. On XLA the per-step weight is sent as a tensor, not baked into the graph as a constant,
so the changing value never triggers a recompilation.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch
from torch._utils import _flatten_dense_tensors as flatten
from torch._utils import _unflatten_dense_tensors as unflatten

from ..core.model import embed_waveforms


class WeightAverage:
    """`module` is a copy of the model, on the model's device, holding the averaged weights.

    With `flat` (the default) the averaged floating-point tensors live in two vectors between reads of
    `module` (the parameters, then the float buffers): an update is a handful of operations and two graph
    outputs whatever the number of tensors. XLA traces every operation again at each step and pays per
    operation and output: a loop over ~150 tensors cost more host time than the forward pass. The integer
    buffers (BatchNorm's batch counters), and the float ones with `average_buffers=False`, are copied when
    `module` is read, not averaged at every step. Reading `module` writes the vectors back into the module's
    tensors (lazily on XLA: part of the next graph)."""

    def __init__(
        self, model: torch.nn.Module, horizon_steps: float, flat: bool = True, average_buffers: bool = True
    ) -> None:
        self._module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = 1.0 - 1.0 / max(1.0, float(horizon_steps))
        self.updates = 0
        self.flat = flat
        # False where the caller recomputes BatchNorm's statistics anyway (recompute_batchnorm): averaging them
        # every step would be traced for nothing.
        self.average_buffers = average_buffers
        # (averaged floats, live floats, averaged others, live others); the floats list the parameters first
        # (model.parameters() order, `_n_params` of them), then the float buffers.
        self._pairs: tuple[list[torch.Tensor], ...] | None = None
        self._float_names: list[str] = []
        self._other_names: list[str] = []
        self._n_params = 0
        self._vectors: list[torch.Tensor] | None = None  # flat: the averaged floats, one vector per group
        self._module_behind = False  # the vectors hold updates the module's tensors have not received

    @property
    def module(self) -> torch.nn.Module:
        if self._module_behind:  # set by a flat update: the vectors and pairs exist
            with torch.no_grad():
                for vector, (averaged, _) in zip(self._vectors, self._float_groups(), strict=True):
                    torch._foreach_copy_(averaged, unflatten(vector, averaged))
                if self._pairs[2]:
                    torch._foreach_copy_(self._pairs[2], self._pairs[3])
            self._module_behind = False
        return self._module

    @torch.no_grad()
    def update(self, model: torch.nn.Module, flat_parameters: torch.Tensor | None = None) -> None:
        """Move the average towards `model`'s current weights (call after every optimizer step).

        `flat_parameters`: `model.parameters()` as one vector, when the caller has it (devices/flat_adam.py's
        step leaves it): the flat average then need not flatten them again. Without `flat`, one foreach
        operation for all floating-point tensors."""
        self.updates += 1
        if self._pairs is None:  # the same tensors every step (moves and loads happen in place before)
            self._pair_up(model)
        assert self._pairs is not None
        average_floats, live_floats, average_others, live_others = self._pairs
        device = average_floats[0].device if average_floats else torch.device("cpu")
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))  # ramped up: the module docstring
        weight = torch.tensor(1.0 - decay, device=device)
        # avg += weight * (live - avg)
        if self.flat and average_floats:
            if self._vectors is None:
                self._vectors = [flatten(averaged) for averaged, _ in self._float_groups()]
            groups = zip(self._vectors, self._float_groups(), strict=True)
            for index, (vector, (_, live)) in enumerate(groups):
                # The caller's vector stands for the parameters group when it is that group's size.
                given = flat_parameters if index == 0 and self._n_params else None
                current = given if given is not None and given.numel() == vector.numel() else flatten(live)
                vector.add_(torch.mul(torch.sub(current, vector), weight))
            self._module_behind = True
            return
        torch._foreach_add_(
            average_floats, torch._foreach_mul(torch._foreach_sub(live_floats, average_floats), weight)
        )
        if average_others:
            torch._foreach_copy_(average_others, live_others)

    def _pair_up(self, model: torch.nn.Module) -> None:
        averaged, current = self._module.state_dict(), model.state_dict()
        parameters = [name for name, _ in model.named_parameters() if name in current]
        buffers = [n for n, t in averaged.items() if t.is_floating_point() and n not in set(parameters)]
        buffers = buffers if self.average_buffers else []
        self._float_names, self._n_params = parameters + buffers, len(parameters)
        others = self._other_names = [name for name in averaged if name not in set(self._float_names)]
        self._pairs = (
            [averaged[n] for n in self._float_names],
            [current[n].detach() for n in self._float_names],
            [averaged[n] for n in others],
            [current[n].detach() for n in others],
        )

    def _float_groups(self) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
        """(averaged, live) tensors of the parameters, then of the float buffers; empty groups left out."""
        assert self._pairs is not None
        averaged, live, n = self._pairs[0], self._pairs[1], self._n_params
        return [group for group in ((averaged[:n], live[:n]), (averaged[n:], live[n:])) if group[0]]

    def state_dict(self) -> dict[str, object]:
        """For checkpoints: the averaged weights (on CPU) and the update count. The flat vectors are read to
        the host in one transfer each and split there (on XLA, reading each slice on the device would compile
        a graph per slice)."""
        weights = {k: v.detach().to("cpu") for k, v in self._module.state_dict().items()}
        if self._module_behind:
            names = iter(self._float_names)
            for vector, (averaged, _) in zip(self._vectors, self._float_groups(), strict=True):
                for value in unflatten(vector.detach().to("cpu"), averaged):
                    weights[next(names)] = value.clone()
            for name, live in zip(self._other_names, self._pairs[3], strict=True):
                weights[name] = live.detach().to("cpu")  # copies of the live model's, as `module` makes them
        return {"weights": weights, "updates": self.updates}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._module.load_state_dict(state["weights"])  # type: ignore[arg-type]  # in place: pairs stay valid
        self._vectors, self._module_behind = None, False  # rebuilt from the loaded tensors at the next update
        self.updates = int(state["updates"])  # type: ignore[arg-type]


@torch.no_grad()
def recompute_batchnorm(
    model: torch.nn.Module,
    wavs: torch.Tensor,
    lens: torch.Tensor,
    forward: Callable[[torch.Tensor, torch.Tensor], object] | None = None,
    batch_size: int | None = None,
) -> None:
    """Replace the BatchNorm running statistics of `model` (a SpeakerClassifier) by the exact average over
    the windows `wavs` [n, samples] with relative lengths `lens`, computed with its current weights.

    `forward(wavs, lens)` runs the model on its device (default: here, on the model's device). The windows go
    through in one batch by default (BatchNorm's momentum 1: exactly that batch's statistics, and on XLA one
    graph with no host round trip); with `batch_size`, in batches whose statistics are averaged cumulatively."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms or len(wavs) == 0:
        return
    if forward is None:
        forward = functools.partial(embed_waveforms, model, device=next(model.parameters()).device)

    batch_size = batch_size or len(wavs)
    was_training, momenta = model.training, [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        # One batch: its statistics exactly. Several: a cumulative average (momentum None), not an exponential.
        norm.momentum = 1.0 if batch_size >= len(wavs) else None
    model.train()  # BatchNorm normalises with, and records, each batch's statistics
    for start in range(0, len(wavs), batch_size):
        forward(wavs[start : start + batch_size], lens[start : start + batch_size])
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
    model.train(was_training)
