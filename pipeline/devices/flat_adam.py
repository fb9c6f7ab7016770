"""torch.optim.Adam's step, with clip_grad_norm_ before it, over all parameters as one flat vector.

Why: on XLA the host traces every operation of the training step again at every step, and pays per
operation. torch's foreach Adam still issues ~8 operations per parameter tensor and clip_grad_norm_ two
more (ECAPA-TDNN has 139 tensors: ~1,400 operations), and every Adam moment is a graph output of its own.
The same arithmetic on one vector is a dozen operations, plus one flatten of the gradients and parameters
and one copy back into the parameters (benchmarks/xla_step.py measures it).

The parameter vector a step computes is kept for the next one, which then starts from it instead of
flattening the 139 parameters again (on XLA a flatten of that many tensors is ~2 ms of trace). It is used only
while every parameter's version counter still reads what the step's own copy left: any in-place change since (a
loaded state_dict, an optimizer step of torch's) makes the next step flatten afresh. Rebinding `.data` does not
move the counter: nothing in training does it between steps (models are moved before the optimizer exists).

The torch optimizer stays the owner of the hyperparameters (the LR scheduler writes its `lr`) and of the
checkpoint format: its `state_dict()` is completed from the flat moments by a hook, and a state loaded into
it (a resumed run) is taken over at the next step. Only a plain Adam qualifies (`FlatAdam.supports`).
"""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors as flatten
from torch._utils import _unflatten_dense_tensors as unflatten


class FlatAdam:
    """Steps `optimizer` (a torch.optim.Adam that `supports` accepts) on flat vectors."""

    def __init__(self, optimizer: torch.optim.Optimizer, reuse_vector: bool = True) -> None:
        self.optimizer = optimizer
        self.reuse_vector = reuse_vector
        self.params: list[torch.Tensor] = list(optimizer.param_groups[0]["params"])
        self.exp_avg: torch.Tensor | None = None  # the moments of all parameters, in `params` order
        self.exp_avg_sq: torch.Tensor | None = None
        self.steps = 0
        self._flat_params: torch.Tensor | None = None  # the vector the last step copied into `params`...
        self._versions_after_copy: list[int] = []  # ...and their version counters right after that copy
        optimizer.register_state_dict_post_hook(self._complete_state_dict)

    @staticmethod
    def supports(optimizer: torch.optim.Optimizer) -> bool:
        """A plain Adam (L2 weight decay, no AMSGrad/maximize) with one group of float32 parameters on one
        device: what training builds. Anything else keeps torch's own step."""
        if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1:
            return False
        group = optimizer.param_groups[0]
        params = group["params"]
        plain = not any(
            group.get(flag)
            for flag in ("amsgrad", "maximize", "differentiable", "fused", "decoupled_weight_decay")
        )
        values = (group["lr"], *group["betas"], group["eps"], group["weight_decay"])
        scalars = not any(isinstance(value, torch.Tensor) for value in values)
        uniform = len({(p.dtype, p.device) for p in params}) == 1 and params[0].dtype == torch.float32
        return bool(params) and plain and scalars and uniform

    @torch.no_grad()
    def step(self, max_grad_norm: float, gradient: torch.Tensor | None = None) -> None:
        """clip_grad_norm_(max_grad_norm) then optimizer.step(), as torch computes them (foreach Adam, not
        capturable); gradients are left in place for the caller's zero_grad. `gradient`: the gradients of
        `params` as one vector, in their order (xla_traced.py computes them so), instead of their `.grad`."""
        if not self._flat_applies(gradient is not None):
            if gradient is not None:  # torch's own step reads .grad
                add_to_grads(self.params, gradient)
            self._hand_back()
            torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm)
            self.optimizer.step()
            return
        if self.optimizer.state:  # a loaded checkpoint, or torch's own step before
            self._take_over()
        group = self.optimizer.param_groups[0]
        lr, (beta1, beta2), eps, weight_decay = (group[k] for k in ("lr", "betas", "eps", "weight_decay"))
        grads = gradient if gradient is not None else flatten([p.grad for p in self.params])
        # clip_grad_norm_: the norm of the per-tensor norms is the norm of the whole vector.
        grads = grads * torch.clamp(max_grad_norm / (torch.linalg.vector_norm(grads) + 1e-6), max=1.0)
        params = self._flat_params if self.flat_parameters() is not None else flatten(self.params)
        if weight_decay != 0:
            grads = grads.add(params, alpha=weight_decay)
        if self.exp_avg is None or self.exp_avg_sq is None:
            self.exp_avg, self.exp_avg_sq = torch.zeros_like(grads), torch.zeros_like(grads)
        self.steps += 1
        self.exp_avg.lerp_(grads, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        denom = self.exp_avg_sq.sqrt().div_((1 - beta2**self.steps) ** 0.5).add_(eps)
        params.addcdiv_(self.exp_avg, denom, value=-lr / (1 - beta1**self.steps))  # bias-corrected
        torch._foreach_copy_(self.params, unflatten(params, self.params))
        self._flat_params, self._versions_after_copy = params, [p._version for p in self.params]

    def flat_parameters(self) -> torch.Tensor | None:
        """The parameters as one vector (`params` order), when the last step's still holds them: callers that
        need that vector (the weight average) then need not flatten them again. None after any other change."""
        if not self.reuse_vector or self._flat_params is None:
            return None
        return self._flat_params if [p._version for p in self.params] == self._versions_after_copy else None

    def _flat_applies(self, gradient_given: bool = False) -> bool:
        """Every parameter has a gradient and one step count (torch skips a parameter without a gradient,
        whose own count then falls behind): one vector can hold their state."""
        if not gradient_given and any(p.grad is None for p in self.params):
            return False
        if not (state := self.optimizer.state):
            return True
        counts = {float(state[p]["step"]) if "step" in state.get(p, {}) else None for p in self.params}
        return len(counts) == 1 and None not in counts

    def _take_over(self) -> None:
        """Adopt the per-parameter state torch holds (all parameters have it, with one step count)."""
        state = self.optimizer.state
        self.exp_avg = flatten([state[p]["exp_avg"] for p in self.params])
        self.exp_avg_sq = flatten([state[p]["exp_avg_sq"] for p in self.params])
        self.steps = int(float(state[self.params[0]]["step"]))
        state.clear()  # one owner at a time: the flat vectors now

    def _per_parameter_state(self, device: torch.device | str) -> list[dict[str, torch.Tensor]]:
        """The flat moments as torch's per-parameter state: moments on `device`, a float step on the CPU."""
        averages = unflatten(self.exp_avg.detach().to(device), self.params)
        squares = unflatten(self.exp_avg_sq.detach().to(device), self.params)
        return [
            {"step": torch.tensor(float(self.steps)), "exp_avg": avg.clone(), "exp_avg_sq": sq.clone()}
            for avg, sq in zip(averages, squares, strict=True)
        ]

    def _hand_back(self) -> None:
        """Give the moments back to torch's per-parameter state."""
        if self.exp_avg is None or self.exp_avg_sq is None:
            return
        self.optimizer.state.update(
            zip(self.params, self._per_parameter_state(self.exp_avg.device), strict=True)
        )
        self.exp_avg = self.exp_avg_sq = None

    def _complete_state_dict(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        """torch's state_dict() with the flat moments as its per-parameter state, read to the host in one
        transfer each and split there: reading each parameter's slice on the device would compile a graph
        per slice on XLA."""
        if self.exp_avg is not None and self.exp_avg_sq is not None:
            state_dict["state"].update(enumerate(self._per_parameter_state("cpu")))
        return state_dict


def add_to_grads(params: list[torch.Tensor], gradient: torch.Tensor) -> None:
    """Add a flat `gradient` (of `params`, in their order) to their `.grad`, as a backward pass would."""
    for param, value in zip(params, unflatten(gradient, params), strict=True):
        param.grad = value if param.grad is None else param.grad + value
