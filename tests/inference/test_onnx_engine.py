"""pipeline/core/onnx.py and inference/engines.py with the real exporter and ONNX Runtime, on a trained tiny model.

Skipped where onnxruntime or torch's exporter (onnxscript, onnx) is not installed: Python 3.10 has no
onnxruntime wheel, and a leg of the version matrix may lack them.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import time

import numpy as np
import pytest
import speechbrain.lobes.models.ECAPA_TDNN as ecapa_module
import torch
from helpers import clip_items, cpu_runtime
from onnx_fixtures import Unexportable
from speechbrain.dataio.dataio import length_to_mask

from pipeline.core import onnx as onnx_engine
from pipeline.core.artifact import load_artifact
from pipeline.core.data import load_audio, windows
from pipeline.core.model import SpeakerClassifier
from pipeline.core.onnx import OnnxEmbedder, export_embedding_model, int8_acceptable, quantize_embedding_model
from pipeline.core.windows import FileWindows, WindowPlan, cosine_scores, run_windows
from pipeline.inference.engines import FirstBatchRace, GuardedEmbedder, TorchEmbedder, make_embedder
from pipeline.inference.runtime import EngineChoice

pytestmark = pytest.mark.skipif(
    onnx_engine.onnxruntime_missing() is not None or onnx_engine.exporter_missing() is not None,
    reason=f"{onnx_engine.onnxruntime_missing() or onnx_engine.exporter_missing()}: the ONNX engine is off here",
)


@pytest.fixture(scope="module")
def model(tiny_artifact):
    return load_artifact(tiny_artifact).model


@pytest.fixture(scope="module")
def exported(tiny_artifact) -> onnx_engine.ExportReport:
    """The fp32 file training's export_embedding_model wrote into the session artifact, and its report as the
    manifest records it (exporting the same model again cost this module ~25 s). Tests only read it."""
    record = json.loads((tiny_artifact / "manifest.json").read_text())["provenance"]["onnx"]
    return onnx_engine.ExportReport(tiny_artifact / record["fp32"]["file"], record["fp32"]["export_s"],
                                    record["fp32"]["max_abs_diff_vs_torch"], record["torch"], record["opset"])  # fmt: skip


def clips_of(model, seconds: list[float], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise windows of other lengths than the export's example (2 windows of 0.5 s: 51 frames)."""
    rng = np.random.default_rng(seed)
    longest = int(max(seconds) * model.config.sample_rate)
    wavs = torch.zeros(len(seconds), longest)
    for row, length in enumerate(seconds):
        n = int(length * model.config.sample_rate)
        wavs[row, :n] = torch.from_numpy((0.1 * rng.standard_normal(n)).astype(np.float32))
    lens = torch.tensor([s / max(seconds) for s in seconds])
    return wavs, lens


def test_export_is_dynamic_in_batch_and_time(exported):
    session = onnx_engine.load_session(exported.path, threads=1)
    shapes = {node.name: node.shape for node in session.get_inputs()}
    assert isinstance(shapes["feats"][0], str) and isinstance(shapes["feats"][1], str)
    assert shapes["wav_lens"][0] == shapes["feats"][0]  # one symbolic batch
    assert exported.max_abs_diff < 1e-5 and exported.path.stat().st_size > 0


@pytest.mark.parametrize("seconds", [[0.3, 1.3, 0.9], [0.8] * 7 + [0.25]])
def test_onnx_embeddings_and_scores_equal_torchs(model, exported, seconds):
    wavs, lens = clips_of(model, seconds)
    expected = TorchEmbedder(model)(wavs, lens)
    found = OnnxEmbedder(model, exported.path, threads=2, precision="fp32")(wavs, lens)
    assert found.shape == expected.shape == (len(seconds), model.config.lin_neurons)
    assert float((found - expected).abs().max()) < 1e-4
    unit_classes = torch.nn.functional.normalize(model.classifier.weight.detach(), dim=1)
    scores = [cosine_scores(e, unit_classes).numpy() for e in (expected, found)]
    np.testing.assert_allclose(scores[1], scores[0], atol=1e-4)
    assert (scores[1].argmax(1) == scores[0].argmax(1)).all()


def test_an_ensemble_exports_and_its_scores_are_the_mean_of_its_members(model, tmp_path):
    torch.manual_seed(0)
    ensemble = SpeakerClassifier(dataclasses.replace(model.config, members=2)).eval()
    exported = export_embedding_model(ensemble, tmp_path / "ensemble.onnx")
    wavs, lens = clips_of(ensemble, [0.3, 1.3, 0.9])
    expected = TorchEmbedder(ensemble)(wavs, lens)
    found = OnnxEmbedder(ensemble, exported.path, threads=2, precision="fp32")(wavs, lens)
    assert found.shape == expected.shape == (3, 2 * model.config.lin_neurons)
    assert float((found - expected).abs().max()) < 1e-4
    # What inference computes from the ONNX embeddings is the mean of each member's cosine with its own centres.
    scores = cosine_scores(found, ensemble.class_centres())
    with torch.no_grad():
        members = ensemble.member_scores(expected)
    assert not torch.allclose(members[:, 0], members[:, 1], atol=1e-3)  # two different models
    np.testing.assert_allclose(scores.numpy(), members.mean(dim=1).numpy(), atol=1e-4)
    # The engines inference builds take the ensemble's wider embedding: they once expected one member's
    # length, so every ensemble's ONNX file failed its first batch and torch computed the whole run.
    for mode in ("onnx", "race"):
        lines: list[str] = []
        embed = make_embedder(ensemble, runtime_for(ensemble, mode, exported.path, batch=3), lines.append)
        for seed in range(6):  # past the race's first batch and its timed ones
            batch = clips_of(ensemble, [0.3, 1.3, 0.9], seed=seed)
            assert float((embed(*batch) - TorchEmbedder(ensemble)(*batch)).abs().max()) < 1e-4
        assert not any("failed" in line or "differs" in line for line in lines), lines
        assert embed.engine in (("onnx-fp32",) if mode == "onnx" else ("onnx-fp32", "torch")), lines
    # Its int8 file too: normalize's ONNX form once stopped onnxruntime's shape inference before quantisation.
    window = ensemble.config.window_samples / ensemble.config.sample_rate
    calibration = clips_of(ensemble, [window] * 16, seed=1)
    int8 = quantize_embedding_model(ensemble, exported.path, tmp_path / "ensemble.int8.onnx", *calibration)
    quantized = OnnxEmbedder(ensemble, int8, threads=2, precision="int8")(wavs, lens)
    assert quantized.shape == expected.shape
    # Untrained weights on noise: a coarser match than a trained model's on speech (the test below), not noise.
    assert float(torch.nn.functional.cosine_similarity(quantized, expected).min()) > 0.8


def file_items(clips: list[np.ndarray], window: int) -> list[FileWindows]:
    return list(clip_items(clips, WindowPlan(window, 16000, 8)))


def runtime_for(model, mode: str, path, precision: str = "fp32", batch: int = 2):
    """A CPU runtime whose engine is `mode` (torch | onnx | race) on the ONNX file `path`."""
    return cpu_runtime(
        model, batch, engine=EngineChoice(mode, precision, "test", str(path) if path else None)
    )


def test_run_windows_with_the_onnx_engine_predicts_torchs_labels(model, exported, synthetic_data):
    clips = [load_audio(path)[0] for path in sorted((synthetic_data / "audio").rglob("*.wav"))[:12]]
    window, cpu = model.config.window_samples, torch.device("cpu")
    plan = WindowPlan(window, 16000, 3)
    reference = run_windows(model, iter(file_items(clips, window)), len(clips), plan, cpu)
    embed = OnnxEmbedder(model, exported.path, threads=2, precision="fp32")
    found = run_windows(model, iter(file_items(clips, window)), len(clips), plan, cpu, embed=embed)
    assert found.ok.all() and reference.ok.all()
    np.testing.assert_allclose(found.scores, reference.scores, atol=1e-4)
    assert (found.scores.argmax(1) == reference.scores.argmax(1)).all()


def test_forced_onnx_announces_itself_once(model, exported):
    lines: list[str] = []
    embed = make_embedder(model, runtime_for(model, "onnx", exported.path, batch=3), lines.append)
    assert embed.engine == "onnx-fp32"
    assert lines == ["inference engine: onnx-fp32, agrees with torch on a probe batch [test]"]
    wavs, lens = clips_of(model, [0.5, 0.4])
    assert float((embed(wavs, lens) - TorchEmbedder(model)(wavs, lens)).abs().max()) < 1e-4


def test_a_race_agrees_with_torch_whichever_engine_it_picks(model, exported):
    lines: list[str] = []
    embed = make_embedder(model, runtime_for(model, "race", exported.path, batch=4), lines.append)
    assert isinstance(embed, FirstBatchRace)
    assert lines == ["inference engine: torch and onnx-fp32 race on the first batch [test]"]
    for seed in range(4):
        wavs, lens = clips_of(model, [0.6, 0.5, 0.2], seed)
        assert float((embed(wavs, lens) - TorchEmbedder(model)(wavs, lens)).abs().max()) < 1e-4
    assert len(lines) == 2 and lines[1].startswith(f"inference engine: {embed.engine}")
    assert embed.engine in ("torch", "onnx-fp32") and "ns per input sample" in lines[1]


class Slowed:
    """An engine `seconds` slower per batch than the one it wraps: the race's outcome made certain. With a
    `clock` (a VirtualClock) it moves that clock by `seconds` instead of sleeping, so the race's timings are
    these costs alone, whatever else the machine is doing (a loaded CI machine once stalled torch past
    0.2 s and the race took a 3rd round)."""

    def __init__(self, embed, seconds: float, name: str | None = None, clock=None) -> None:
        self.embed, self.seconds, self.engine, self.calls = embed, seconds, name or embed.engine, 0
        self.clock = clock

    def __call__(self, wavs, lens):
        self.calls += 1
        if self.clock is None:
            time.sleep(self.seconds)
        else:
            self.clock.now += self.seconds
        return self.embed(wavs, lens)


class VirtualClock:
    """A clock that only the Slowed engines move: FirstBatchRace(clock=...) sees their costs, not the load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def slowed_pair(model, exported, slow: str) -> tuple:
    """ONNX Runtime fp32 and torch, and each wrapped in Slowed on one VirtualClock: the one named by `slow`
    costs 0.2 s a batch, the other 0.01 s. Returns them and the clock for FirstBatchRace."""
    onnx, torch_embed = OnnxEmbedder(model, exported.path, threads=1, precision="fp32"), TorchEmbedder(model)
    clock = VirtualClock()
    return (
        onnx,
        torch_embed,
        Slowed(onnx, 0.2 if slow == "onnx" else 0.01, clock=clock),
        Slowed(torch_embed, 0.2 if slow == "torch" else 0.01, clock=clock),
        clock,
    )


@pytest.mark.parametrize("precision", ["int8", "fp32"])
@pytest.mark.parametrize("slow", ["onnx", "torch"])
def test_the_race_is_run_on_the_first_batch_and_every_row_comes_from_the_winner(
    model, exported, slow, precision
):
    """The race is decided on the first batch (computed again by each engine in turn), whose result is the
    winner's, so a run's rows all come from one engine. `precision` chooses how ONNX is checked against torch;
    the engine here is the fp32 file (the mechanics, not the quantisation: int8 on this tiny model and noise is
    test_int8_embeddings_stay_close_to_fp32_on_real_speech's subject)."""
    onnx, torch_embed, onnx_side, torch_side, clock = slowed_pair(model, exported, slow)
    lines: list[str] = []
    race = FirstBatchRace(
        onnx_side, torch_side, model.config.lin_neurons, precision, lines.append, clock=clock
    )
    winner = onnx if slow == "torch" else torch_embed
    for seed in range(4):
        wavs, lens = clips_of(model, [0.7, 0.4, 0.9], seed)
        assert torch.equal(race(wavs, lens), winner(wavs, lens))
        assert len(lines) == 1  # decided during the first batch
    assert race.engine == ("torch" if slow == "onnx" else "onnx-fp32")
    assert "median of 2 runs each" in lines[0]
    # first batch: torch once untimed + 2 timed, ONNX on 2 windows + 2 timed; then 3 batches by the winner
    assert (onnx_side.calls, torch_side.calls) == ((3, 3 + 3) if winner is torch_embed else (3 + 3, 3))


def test_engines_close_together_race_until_decided_on_their_own_timings(model):
    """Two copies of one engine (one named "copy"): no clear gap, so the race takes 3 timed runs each unless
    2 each happened to be apart; either way each side's timings are its own, the first batch decides, and
    torch's results come back throughout."""
    torch_embed = TorchEmbedder(model)
    lines: list[str] = []
    race = FirstBatchRace(Slowed(torch_embed, 0.0, name="copy"), torch_embed, model.config.lin_neurons, "fp32",
                          lines.append)  # fmt: skip
    for seed in range(3):
        wavs, lens = clips_of(model, [0.7, 0.4], seed)
        assert torch.equal(race(wavs, lens), torch_embed(wavs, lens))
        assert race.winner is not None
    assert len(lines) == 1 and race.engine in ("copy", "torch")
    assert len(race.per_sample["copy"]) == len(race.per_sample["torch"]) in (2, 3)


@pytest.mark.parametrize(
    ("onnx_cost", "winner"), [(0.009, "onnx-fp32"), (0.014, "onnx-fp32"), (0.016, "torch")]
)
def test_torch_takes_the_race_only_when_it_is_clearly_faster(model, exported, onnx_cost, winner):
    """Engines close together would swap places from run to run with the machine's load (and int8 writes other
    scores than torch): the artifact's ONNX file keeps the run unless torch is TORCH_MUST_WIN_BY (1.5) times
    faster. Torch costs 0.01 s a batch on a virtual clock; ONNX 0.9x, 1.4x and 1.6x that."""
    from pipeline.inference.engines import TORCH_MUST_WIN_BY

    assert TORCH_MUST_WIN_BY == 1.5
    onnx, torch_embed = OnnxEmbedder(model, exported.path, threads=1, precision="fp32"), TorchEmbedder(model)
    clock, lines = VirtualClock(), []
    race = FirstBatchRace(Slowed(onnx, onnx_cost, clock=clock), Slowed(torch_embed, 0.01, clock=clock),
                          model.config.lin_neurons, "fp32", lines.append, clock=clock)  # fmt: skip
    wavs, lens = clips_of(model, [0.7, 0.4], 0)
    expected = (onnx if winner == "onnx-fp32" else torch_embed)(wavs, lens)
    assert torch.equal(race(wavs, lens), expected) and race.engine == winner
    assert len(lines) == 1 and lines[0].startswith(f"inference engine: {winner}, ")
    # Slower but within the margin: the line says so, and at what torch would have won.
    assert ("torch wins only at 1.5x" in lines[0]) == (onnx_cost == 0.014)


def test_the_race_ends_for_torch_when_onnx_disagrees_or_fails(model, exported, tmp_path):
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(exported.path))
    weight = next(t for t in graph.graph.initializer if len(t.dims) == 3)
    weight.CopyFrom(numpy_helper.from_array(1.5 * numpy_helper.to_array(weight), weight.name))
    foreign = tmp_path / "foreign.onnx"
    onnx.save(graph, str(foreign))
    wider = type(model)(type(model.config)(**{**model.config.to_dict(), "n_mels": 80})).eval()
    mismatched = export_embedding_model(wider, tmp_path / "wider.onnx").path
    for path, why in ((foreign, "differs from torch by"), (mismatched, "failed on a batch of 2 windows")):
        lines: list[str] = []
        race = FirstBatchRace(OnnxEmbedder(model, path, threads=1, precision="fp32"), TorchEmbedder(model),
                              model.config.lin_neurons, "fp32", lines.append)  # fmt: skip
        for seed in range(3):
            wavs, lens = clips_of(model, [0.5, 0.3], seed)
            assert torch.equal(race(wavs, lens), TorchEmbedder(model)(wavs, lens))
        assert race.engine == "torch" and len(lines) == 1 and why in lines[0], lines


def test_the_torch_engine_says_why(model):
    lines: list[str] = []
    assert isinstance(make_embedder(model, runtime_for(model, "torch", None), lines.append), TorchEmbedder)
    assert lines == ["inference engine: torch on cpu (test)"]


def test_a_corrupt_onnx_file_falls_back_to_torch_with_one_line(model, exported, tmp_path):
    corrupt = tmp_path / "embedding_model.onnx"
    corrupt.write_bytes(exported.path.read_bytes()[:5000])  # a truncated download or copy
    for mode in ("onnx", "race"):
        lines: list[str] = []
        embed = make_embedder(model, runtime_for(model, mode, corrupt), lines.append)
        assert isinstance(embed, TorchEmbedder)
        assert len(lines) == 1 and lines[0].startswith("inference engine: torch (onnx-fp32 unavailable:")
        wavs, lens = clips_of(model, [0.5, 0.3])
        assert torch.equal(embed(wavs, lens), TorchEmbedder(model)(wavs, lens))


def test_an_onnx_file_of_other_weights_is_refused(model, exported, tmp_path):
    """A file that loads and runs but holds other weights (an artifact mixed up with another's file)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(exported.path))
    weight = next(t for t in graph.graph.initializer if len(t.dims) == 3)  # the first convolution's kernel
    weight.CopyFrom(numpy_helper.from_array(1.5 * numpy_helper.to_array(weight), weight.name))
    foreign = tmp_path / "foreign.onnx"
    onnx.save(graph, str(foreign))
    lines: list[str] = []
    embed = make_embedder(model, runtime_for(model, "onnx", foreign), lines.append)
    assert isinstance(embed, TorchEmbedder)
    assert len(lines) == 1 and "differs from torch" in lines[0]


def test_an_export_that_fails_says_why(model):
    broken = copy.deepcopy(model)
    broken.embedding_model = Unexportable(broken.embedding_model)
    with pytest.raises(onnx_engine.ExportError, match="could not export the embedding model"):
        export_embedding_model(broken, "/nonexistent/never-written.onnx")
    # The export's stand-in for SpeechBrain's mask is swapped back however the export ends.
    assert ecapa_module.length_to_mask is length_to_mask


@pytest.mark.parametrize("lengths", [[1.0, 0.6], [0.3], [1.0, 1.0, 0.05, 0.5]])
def test_the_exports_mask_is_speechbrains_mask(lengths):
    """The mask non-strict tracing sees (symbolic in the batch) has SpeechBrain's values, dtype and device."""
    relative = torch.tensor(lengths)
    for args in [(relative * 57, 57), (relative * 8, 8)]:
        for dtype in (None, torch.bool, torch.float32):
            expected = length_to_mask(*args, dtype=dtype)
            found = onnx_engine._length_to_mask(*args, dtype=dtype)
            assert found.dtype == expected.dtype and torch.equal(found, expected)


def test_a_batch_that_fails_mid_run_is_computed_by_torch_and_no_row_is_lost(model, tmp_path, synthetic_data):
    """An ONNX file for 80 mel bands behind a 40-band model: ONNX Runtime rejects every batch at run time."""
    wider = type(model)(type(model.config)(**{**model.config.to_dict(), "n_mels": 80})).eval()
    mismatched = export_embedding_model(wider, tmp_path / "wider.onnx").path
    lines: list[str] = []
    guarded = GuardedEmbedder(OnnxEmbedder(model, mismatched, threads=1, precision="fp32"), TorchEmbedder(model),
                              model.config.lin_neurons, lines.append)  # fmt: skip
    clips = [load_audio(path)[0] for path in sorted((synthetic_data / "audio").rglob("*.wav"))[:6]]
    window, cpu = model.config.window_samples, torch.device("cpu")
    plan = WindowPlan(window, 16000, 2)
    found = run_windows(model, iter(file_items(clips, window)), len(clips), plan, cpu, embed=guarded)
    reference = run_windows(model, iter(file_items(clips, window)), len(clips), plan, cpu)
    assert found.ok.all() and not found.problems
    np.testing.assert_allclose(found.scores, reference.scores, atol=1e-6)
    assert len(lines) == 1 and "onnx-fp32 failed on a batch" in lines[0]
    assert guarded.engine == "onnx-fp32, then torch (a batch failed)"


def fsdd_windows(model, paths) -> tuple[torch.Tensor, torch.Tensor]:
    cut = [windows(load_audio(path)[0], model.config.window_samples, 64) for path in paths]
    return torch.from_numpy(np.concatenate([w for w, _ in cut])), torch.from_numpy(
        np.concatenate([r for _, r in cut])
    )


def int8_weight_range(path) -> tuple[int, int]:
    """The smallest and largest value of the int8 initializers (the quantised weights) of an ONNX file."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    weights = [numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert weights, f"{path}: no int8 weights"
    return min(int(w.min()) for w in weights), max(int(w.max()) for w in weights)


def int8_cosine(model, exported, int8_path, held_out) -> torch.Tensor:
    fp32 = OnnxEmbedder(model, exported.path, threads=2, precision="fp32")(*held_out)
    int8 = OnnxEmbedder(model, int8_path, threads=2, precision="int8")(*held_out)
    return torch.nn.functional.cosine_similarity(int8, fp32, dim=1)


def test_int8_embeddings_stay_close_to_fp32_on_real_speech(model, exported, fsdd_recordings, tmp_path):
    """On any x86 CPU: full-range int8 weights saturate VPMADDUBSW's 16-bit sums on CPUs without VNNI (this
    test failed there with cosine 0.90 before the weights were kept to 7 bits; the range check fails on any)."""
    recordings = sorted(fsdd_recordings.glob("*.wav"))
    calibration = fsdd_windows(model, recordings[::40])  # 68 recordings across speakers and digits
    int8_path = quantize_embedding_model(model, exported.path, tmp_path / onnx_engine.ONNX_INT8, *calibration)
    held_out = fsdd_windows(model, recordings[7::50])  # other recordings than the calibration's
    cosine = int8_cosine(model, exported, int8_path, held_out)
    assert float(cosine.mean()) > 0.99 and float(cosine.min()) > 0.95, cosine
    low, high = int8_weight_range(int8_path)
    assert -64 <= low and high <= 64 and high - low > 100  # 255 x 64 x 2 < 32,767, and the range used
    assert int8_path.stat().st_size < exported.path.stat().st_size  # int8 weights are in it
    lines: list[str] = []
    embed = make_embedder(model, runtime_for(model, "onnx", int8_path, "int8", batch=4), lines.append)
    assert embed.engine == "onnx-int8" and len(lines) == 1


def test_a_full_range_int8_file_from_an_older_artifact_stays_close_to_fp32(
    model, exported, fsdd_recordings, tmp_path
):
    """Artifacts written before the 7-bit weights carry full-range ones; load_session has ONNX Runtime multiply
    those exactly on CPUs without VNNI (where this test can fail: cosine 0.90 without it, an AVX2-only EPYC).
    On a CPU with VNNI there is nothing to saturate and it passes either way."""
    recordings = sorted(fsdd_recordings.glob("*.wav"))
    old_file = quantize_embedding_model(
        model,
        exported.path,
        tmp_path / "old.int8.onnx",
        *fsdd_windows(model, recordings[::40]),
        reduce_range=False,
    )
    assert int8_weight_range(old_file)[1] > 64  # the older kind of file indeed
    cosine = int8_cosine(model, exported, old_file, fsdd_windows(model, recordings[7::50]))
    assert float(cosine.mean()) > 0.99 and float(cosine.min()) > 0.95, cosine


def test_the_int8_rule():
    assert int8_acceptable(0.990, 0.985) and int8_acceptable(0.990, 0.995)
    assert not int8_acceptable(0.990, 0.984)
    assert importlib.util.find_spec("onnxruntime.quantization") is not None


def test_the_exported_frame_range_keeps_every_preset_within_int32():
    """torch 2.10 refuses a voxceleb-size export whose frames x (3 x widest channels) may pass 2^31."""
    from pipeline.core.config import MODEL_PRESETS

    for preset, sizes in MODEL_PRESETS.items():
        assert onnx_engine.MAX_FRAMES * 3 * sizes["channels"][-1] < 2**31, preset
