"""devices/xla_traced.py on torch_xla's CPU backend with 8 devices: the step traced once per input shape computes
what the step traced at every step computes, with gradient accumulation and with an optimizer over part of the
model, and a step it cannot trace once (random numbers on the device) falls back with a line in the log."""

import json
import subprocess
import sys

import pytest
from helpers import XLA_STAND_IN, venv_env

pytestmark = [pytest.mark.slow, pytest.mark.xla]

SCRIPT = """
import copy, json, sys, torch
from pipeline.devices.probe import detect_topology
from pipeline.devices.xla import XLASpmdStrategy
from pipeline.core.model import ModelConfig, SpeakerClassifier
from pipeline.core.objectives import make_loss
from pipeline.training.train import train_step

torch.manual_seed(0)
initial = SpeakerClassifier(ModelConfig.from_preset("tiny", n_classes=10, n_mels=40, window_samples=8000))
generator = torch.Generator().manual_seed(1)

def batch(rows, frames):
    return {"inputs": torch.randn(rows, frames, 40, generator=generator), "lens": torch.ones(rows),
            "labels": torch.randint(0, 10, (rows,), generator=generator)}

# (micro-batches of one step, ...): two shapes, the first again after the second
steps = [[batch(16, 51), batch(16, 51)], [batch(8, 41), batch(8, 41)], [batch(16, 51), batch(16, 51)]]
trace_once = sys.argv[1] == "once"
found = {}
strategy = XLASpmdStrategy(detect_topology("tpu"), "fp32")
strategy.trace_once = trace_once
model = strategy.setup_model(copy.deepcopy(initial))
# An optimizer over the classifier and the last block only (as a partly frozen encoder would have).
trained = [p for name, p in model.named_parameters() if not name.startswith("embedding_model.blocks.0.")]
optimizer = torch.optim.Adam(trained, lr=1e-3, weight_decay=2e-5, foreach=True)
losses = []
for micro in steps:
    on_device = list(strategy.device_batches(iter(micro)))
    # A loss function asked for again (training does at every epoch) is the one the trace was keyed on.
    loss_fn = make_loss("aam", 0.2, 30.0)
    losses.append(float(train_step(model, strategy, loss_fn, optimizer, on_device)))
compiles = strategy.compile_count()  # the steps' graphs, before reading the weights compiles more
found["step"] = {
    "losses": losses,
    "weights": [float(p.detach().double().sum().cpu()) for p in model.parameters()],
    "statistics": [float(b.detach().double().sum().cpu()) for b in model.buffers()],
    "traces": strategy._traced.traces if strategy._traced is not None else 0,
    "compiles": compiles,
}

if trace_once:
    print(json.dumps(found))
    sys.exit(0)

class Noisy(torch.nn.Module):  # dropout draws random numbers inside the step
    def __init__(self):
        super().__init__()
        self.layer, self.dropout = torch.nn.Linear(40, 10), torch.nn.Dropout(0.5)
    def forward(self, inputs, lens, features_ready=True):
        return self.dropout(self.layer(inputs.mean(dim=1)))

strategy = XLASpmdStrategy(detect_topology("tpu"), "fp32")
model = strategy.setup_model(Noisy())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
micro = list(strategy.device_batches(iter([batch(16, 51)])))
loss = float(train_step(model, strategy, torch.nn.functional.cross_entropy, optimizer, micro))
found["random"] = {"loss": loss, "trace_once": strategy.trace_once}
print(json.dumps(found))
"""


@pytest.mark.timeout(600)
def test_traced_once_equals_traced_every_step_with_accumulation_shapes_and_part_of_the_model_trained():
    env = venv_env(TF_CPP_MIN_LOG_LEVEL="2", **XLA_STAND_IN)
    # The two ways run as two processes side by side (alone on 2 cores, with XLA_STAND_IN's compile flags, this
    # test took 65 s on 2026-11-29; each way alone 47 s, and 145 s without the flags).
    command = [sys.executable, "-c", SCRIPT]
    runs = {
        way: subprocess.Popen(
            [*command, way], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for way in ("once", "every")
    }
    found, printed = {}, {}
    try:
        for way, run in runs.items():
            printed[way], stderr = run.communicate(timeout=500)
            assert run.returncode == 0, f"{way}: {stderr[-3000:]}"
            found[way] = json.loads(printed[way].strip().splitlines()[-1])
    finally:
        for run in runs.values():
            run.kill()  # the other way's process, when one failed
    once, every = found["once"]["step"], found["every"]["step"]
    assert once["losses"] == pytest.approx(every["losses"], rel=1e-6)
    # Weights to within a fraction of one Adam step (lr 1e-3): torch_xla 2.7 fuses the called computation a
    # little differently, and Adam turns a rounding difference in a near-zero gradient into a step's worth.
    assert once["weights"] == pytest.approx(every["weights"], rel=1e-5, abs=1e-3)
    assert once["statistics"] == pytest.approx(every["statistics"], rel=1e-6, abs=1e-6)
    assert len(set(once["losses"])) == 3  # the steps moved the weights
    # One trace per input shape: the first shape's is reused after the second's.
    assert (once["traces"], every["traces"]) == (2, 0)
    # Two graphs per input shape at most (the first step also creates the optimizer's state): 3 here.
    assert once["compiles"] <= 3 and every["compiles"] <= 3
    # Dropout draws random numbers on the device: traced once, every step would reuse the first step's.
    assert (
        "random numbers on the XLA device: its forward and backward are traced at every step"
        in printed["every"]
    )
    assert found["every"]["random"]["trace_once"] is False
    assert 0 < found["every"]["random"]["loss"] < 10  # and the step ran, traced the old way
