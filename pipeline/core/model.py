"""The model: SpeechBrain's Fbank front end, ECAPA-TDNN embedding model and cosine classifier.

The module names (`compute_features`, `mean_var_norm`, `embedding_model`, `classifier`) are SpeechBrain's own
(spkrec-ecapa-voxceleb's hyperparams.yaml), so an artifact's weights load unchanged into SpeechBrain's
`EncoderClassifier` as well as into this class.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from speechbrain.lobes.features import Fbank
from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
from speechbrain.processing.features import InputNormalization

from .buckets import Buckets, length_groups
from .config import MAX_WINDOWS_PER_FILE, MODEL_PRESETS, QUIET_WINDOW_DB, SAMPLE_RATE
from .data import file_windows  # the numpy windowing inference uses, shared by WindowedEncoder


@dataclass
class ModelConfig:
    """Everything needed to rebuild the network: stored in the artifact (nanoGPT's "model_args")."""

    n_classes: int
    n_mels: int = 80
    channels: list[int] = field(default_factory=lambda: list(MODEL_PRESETS["small"]["channels"]))
    lin_neurons: int = 128
    attention_channels: int = 64
    se_channels: int = 64
    window_samples: int = SAMPLE_RATE
    sample_rate: int = SAMPLE_RATE
    score_scale: float = 30.0  # the AAM scale: softmax(scale * cosine) are the class probabilities
    # What the classifier was trained for: "aam" (one class per clip, softmax) or "bce"/"focal" (several, an
    # independent sigmoid(scale * cosine) per class; pipeline/core/objectives.py).
    objective: str = "aam"
    # The features between the Fbank and the mean normalisation: "logmel" (SpeechBrain's, in dB) or "pcen"
    # (per-channel energy normalisation: each mel band divided by its own running level; see PCEN).
    frontend: str = "logmel"
    # Independently initialised ECAPA-TDNNs trained side by side on the same batches, each with its own class
    # centres and loss: an ensemble in one model, whose scores are the mean of its members' cosines.
    members: int = 1

    @property
    def embedding_size(self) -> int:
        """Length of the model's embedding: the members' embeddings side by side."""
        return self.lin_neurons * self.members

    @classmethod
    def from_preset(cls, preset: str, **overrides: Any) -> ModelConfig:
        return cls(**{**MODEL_PRESETS[preset], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SpeakerClassifier(torch.nn.Module):
    """waveforms [B, T] at `config.sample_rate` + relative lengths [B] -> cosine scores [B, n_classes]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.compute_features = fbank(config.n_mels, config.sample_rate)
        self.pcen = PCEN() if config.frontend == "pcen" else None
        self.mean_var_norm = InputNormalization(norm_type="sentence", std_norm=False)
        encoder_args = {
            "input_size": config.n_mels,
            "channels": list(config.channels),
            "lin_neurons": config.lin_neurons,
            "attention_channels": config.attention_channels,
            "se_channels": config.se_channels,
        }
        self.embedding_model = (
            ECAPA_TDNN(**encoder_args)
            if config.members == 1
            else MemberEncoders(config.members, **encoder_args)
        )
        self.classifier = Classifier(input_size=config.embedding_size, out_neurons=config.n_classes)

    def features(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        """Normalised log-mel features [B, frames, n_mels]. Kept separate so XLA can run it on the host."""
        return Frontend.forward(self, wavs, wav_lens)

    def embed(self, feats: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        """Speaker embeddings [B, embedding_size]."""
        return self.embedding_model(feats, wav_lens).squeeze(1)

    def scores(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Cosine similarity to each class centre [B, n_classes] (what SpeechBrain's classify_batch returns),
        in fp32 whatever autocast says: in bf16 a cosine near 1 has a resolution of 2^-8, 0.12 per logit at
        scale 30 -- coarser than the effect of the 0.2 rad margin the loss trains with. With several members,
        the mean of the members' cosines."""
        if self.config.members > 1:
            return self.member_scores(embeddings).mean(dim=1)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return self.classifier(embeddings.float().unsqueeze(1)).squeeze(1)

    def member_scores(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Each member's cosines with its own class centres [B, members, n_classes], in fp32."""
        members = self.config.members
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            parts = embeddings.float().unflatten(-1, (members, -1))  # [B, members, D]
            centres = self.classifier.weight.float().unflatten(-1, (members, -1))  # [C, members, D]
            unit = torch.nn.functional.normalize
            return torch.einsum("bmd,cmd->bmc", unit(parts, dim=-1), unit(centres, dim=-1))

    def class_centres(self) -> torch.Tensor:
        """Unit class centres [n_classes, embedding_size] whose cosine with an embedding is `scores`: each
        member's centres at unit length, side by side and scaled by 1/sqrt(members), as its embeddings are
        (MemberEncoders). What inference scores windows with and what SpeechBrain's Classifier is given."""
        # A few kB, computed on the host: torch_xla refuses a view (unflatten) of an inference-mode tensor.
        weight = self.classifier.weight.detach().to("cpu", torch.float32)
        members = self.config.members
        unit = torch.nn.functional.normalize(weight.unflatten(-1, (members, -1)), dim=-1)
        return (unit.flatten(-2) / members**0.5).to(self.classifier.weight.device)

    def forward(
        self, inputs: torch.Tensor, wav_lens: torch.Tensor, features_ready: bool = False
    ) -> torch.Tensor:
        """Training scores from waveforms, or from `features(...)` output when `features_ready` (the XLA path
        computes features on the host): [B, n_classes], or with several members each member's own
        [B, members, n_classes] (each learns alone; objectives.make_loss sums their losses). One entry point,
        so DistributedDataParallel's forward hooks always run."""
        feats = inputs if features_ready else self.features(inputs, wav_lens)
        embeddings = self.embed(feats, wav_lens)
        return self.member_scores(embeddings) if self.config.members > 1 else self.scores(embeddings)


class MemberEncoders(torch.nn.Module):
    """Several ECAPA-TDNNs on the same features (SpeakerClassifier's `members`): their unit-length embeddings
    side by side, scaled by 1/sqrt(members) so the whole has unit length. The cosine of that with centres laid
    out the same way (SpeakerClassifier.class_centres) is the mean of the members' own cosines, so an
    ensemble scores through every path a single model does: inference, ONNX, SpeechBrain's Classifier."""

    def __init__(self, members: int, **encoder_args: Any) -> None:
        super().__init__()
        self.encoders = torch.nn.ModuleList(ECAPA_TDNN(**encoder_args) for _ in range(members))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        parts = [_unit(encoder(x, lengths)) for encoder in self.encoders]
        return torch.cat(parts, dim=-1) / len(parts) ** 0.5


def _unit(x: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.normalize(x, dim=-1), written with a sum of squares: normalize's norm exports as an
    ONNX ReduceL2 (and an Expand) that onnxruntime's symbolic shape inference cannot size, which failed the
    int8 quantisation of an ensemble (ReduceSum it sizes)."""
    return x * (x * x).sum(dim=-1, keepdim=True).clamp_min(1e-24).rsqrt()


def fbank(n_mels: int, sample_rate: int = SAMPLE_RATE) -> Fbank:
    """SpeechBrain's Fbank at `sample_rate`: mel bands from 0 Hz to half the rate, 25 ms windows every 10 ms
    (SpeechBrain's n_fft of 400 is 25 ms at 16 kHz; at other rates the FFT follows the window length)."""
    return Fbank(n_mels=n_mels, sample_rate=sample_rate, n_fft=int(round(0.025 * sample_rate)))


FRONTENDS = ("logmel", "pcen")


class PCEN(torch.nn.Module):
    """Per-channel energy normalisation (Wang et al., 2017; Lostanlen et al., 2019, "why and how" for
    bioacoustics) of SpeechBrain's log-mel features, with librosa's default constants.

    Each mel band's energy E is divided by its own running level M (a first-order smoother over ~0.4 s, started
    from the band's median over the window's valid frames), then root-compressed: (E / M^0.98 + 2)^0.5 - 2^0.5,
    where log-mel takes the logarithm of E. On the FSDD soundscape benchmark (calls at -6..12 dB in wind and
    noise) it took macro ROC-AUC from 0.950 to 0.975 over 3 seeds each, most of it on the calls within 0 dB of
    their background (README, "Measured decisions"); why it helps there was measured, not derived. The smoother
    is causal, so frames after a window's valid part never change the valid ones (length buckets and padding
    stay exact), and it is one matrix product over the frames, not a loop."""

    def __init__(
        self,
        time_frames: float = 40.0,
        gain: float = 0.98,
        bias: float = 2.0,
        power: float = 0.5,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        # librosa.pcen's smoothing coefficient for a time constant of `time_frames` frames (0.4 s at 10 ms).
        self.b = ((1 + 4 * time_frames**2) ** 0.5 - 1) / (2 * time_frames**2)
        self.gain, self.bias, self.power, self.eps = gain, bias, power, eps

    def forward(self, feats_db: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        """log-mel features [B, T, F] in dB (SpeechBrain's Fbank) and relative lengths [B] -> PCEN [B, T, F]."""
        energy = 10.0 ** (feats_db / 10.0)
        frames = feats_db.shape[1]
        valid_frames = (wav_lens * frames).round().clamp(min=1)
        valid = torch.arange(frames, device=feats_db.device)[None, :] < valid_frames[:, None]
        start = torch.nanmedian(energy.masked_fill(~valid[:, :, None], float("nan")), dim=1).values
        t = torch.arange(frames, device=feats_db.device, dtype=energy.dtype)
        lag = t[:, None] - t[None, :]
        weights = torch.where(lag >= 0, self.b * (1 - self.b) ** lag.clamp(min=0), torch.zeros_like(lag))
        decayed_start = (1 - self.b) ** (t + 1)[None, :, None] * start[:, None]  # the start level, fading
        level = torch.einsum("tk,bkf->btf", weights, energy) + decayed_start
        return (energy / (self.eps + level) ** self.gain + self.bias) ** self.power - self.bias**self.power


class Frontend(torch.nn.Module):
    """The parameter-free front end alone (Fbank, PCEN if chosen, sentence mean normalisation), for computing
    features on the host. SpeakerClassifier.features runs this same code on its own identically named modules."""

    def __init__(self, n_mels: int, sample_rate: int = SAMPLE_RATE, frontend: str = "logmel") -> None:
        super().__init__()
        if frontend not in FRONTENDS:
            raise ValueError(f"frontend {frontend!r} is not one of {FRONTENDS}")
        self.compute_features = fbank(n_mels, sample_rate)
        self.pcen = PCEN() if frontend == "pcen" else None
        self.mean_var_norm = InputNormalization(norm_type="sentence", std_norm=False)

    def forward(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        # Features in fp32 even under autocast: log-mel energies lose too much in fp16/bf16.
        with torch.autocast(device_type=wavs.device.type, enabled=False):
            feats = self.compute_features(wavs.float())
            if self.pcen is not None:
                feats = self.pcen(feats, wav_lens)
            return self.mean_var_norm(feats, wav_lens)


class WindowedEncoder(torch.nn.Module):
    """The model as SpeechBrain's `EncoderClassifier` runs it from an artifact's hyperparams.yaml: whole files
    in, one embedding per file out, computed exactly as this project's inference computes it.

    The ECAPA-TDNN was trained on fixed windows (padding included: see data.windows), so a whole short file
    fed to it unpadded gets other, worse, scores. This wrapper cuts every file of the batch into the same
    windows, embeds them with the same front end, and returns the weighted mean of the unit-length window
    embeddings [B, 1, D] (each window weighs its valid length, and with `energy_weighted` its energy; with
    `speeds`, the file is also played at each and every view counts alike: data.file_windows) -- minus the
    artifact's `centre` when it carries one (core/windows.py) --;
    SpeechBrain's cosine `Classifier` then scores it. In the yaml, `compute_features` and `mean_var_norm` are
    `PassThrough`s, so this module receives the waveforms.
    """

    def __init__(
        self,
        encoder: ECAPA_TDNN,
        n_mels: int,
        window_samples: int,
        max_windows: int = MAX_WINDOWS_PER_FILE,
        sample_rate: int = SAMPLE_RATE,
        length_buckets: int = 1,
        frontend: str = "logmel",
        quiet_db: float | None = QUIET_WINDOW_DB,
        centre: list[float] | None = None,
        energy_weighted: bool = False,
        speeds: list[float] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.centre = None if centre is None else torch.tensor(centre, dtype=torch.float32)
        self.quiet_db = quiet_db  # a clip's windows this far below its loudest are left out, as at inference
        # False for artifacts written before the infer stage weighed windows by energy (their yaml lacks it).
        self.energy_weighted = energy_weighted
        # The speeds each file is also played at (data.file_windows); None, as in older yaml files: as it is.
        self.speeds = tuple(speeds) if speeds else (1.0,)
        self.frontend = Frontend(n_mels, sample_rate, frontend)
        self.window_samples, self.max_windows = window_samples, max_windows
        # Short windows at shorter lengths, as the infer stage runs them (pipeline/core/buckets.py; 1: full windows).
        self.buckets = (
            Buckets.plan(window_samples, sample_rate, length_buckets) if length_buckets > 1 else None
        )

    def forward(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        chunks, lens, weights, owners = [], [], [], []
        for index in range(wavs.shape[0]):
            valid = max(1, int(round(float(wav_lens[index]) * wavs.shape[1])))
            audio = wavs[index, :valid].detach().cpu().numpy()
            cut, rel, weight = file_windows(
                audio,
                self.window_samples,
                self.max_windows,
                quiet_db=self.quiet_db,
                energy_weighted=self.energy_weighted,
                speeds=self.speeds,
            )
            chunks.append(cut)
            lens.append(rel)
            weights.append(weight)
            owners += [index] * len(cut)
        rel = np.concatenate(lens)
        embeddings = self._embed(np.concatenate(chunks), rel, wavs.device)
        # Per file, the weighted mean of its unit window embeddings: scored by the cosine classifier, it ranks
        # classes as the weighted mean of the windows' cosines would (the classifier's own normalisation
        # rescales every class alike).
        sums = torch.zeros(wavs.shape[0], embeddings.shape[1], device=wavs.device)
        totals = torch.zeros(wavs.shape[0], device=wavs.device)
        owner = torch.tensor(owners, device=wavs.device)
        pooling_weights = torch.from_numpy(np.concatenate(weights)).to(wavs.device)
        add_windows(sums, totals, embeddings, pooling_weights, owner)
        mean = sums / totals.clamp_min(1e-12)[:, None]
        # Minus the centre, as inference's cosine_scores (SpeechBrain's classifier normalises what it is given).
        if self.centre is not None:
            mean = _unit(mean) - self.centre.to(mean.device)
        return mean.unsqueeze(1)

    def _embed(self, batch: np.ndarray, rel: np.ndarray, device: torch.device) -> torch.Tensor:
        """Window embeddings [n, D], each window at its bucket's length (all at full length without buckets)."""
        parts: list[tuple[np.ndarray, torch.Tensor]] = []
        for length, chosen, rel_at in length_groups(rel, self.window_samples, self.buckets):
            wavs = torch.from_numpy(np.ascontiguousarray(batch[chosen, :length])).to(device)
            lens = torch.from_numpy(rel_at).to(device)
            parts.append((chosen, self.encoder(self.frontend(wavs, lens), lens).squeeze(1)))
        out = torch.empty(len(rel), parts[0][1].shape[1], device=device, dtype=parts[0][1].dtype)
        for chosen, embeddings in parts:
            out[torch.from_numpy(chosen).to(device)] = embeddings
        return out


class PassThrough(torch.nn.Module):
    """Stands for `compute_features` and `mean_var_norm` in the artifact's yaml (WindowedEncoder does both)."""

    def forward(self, x: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
        return x


def label_encoder(n_classes: int) -> Any:
    """SpeechBrain's CategoricalEncoder for an artifact's yaml, told how many classes the classifier has.

    SpeechBrain then checks the loaded label_encoder.ckpt against that count (a mismatch raises when
    decoding) instead of warning "expect_len was never called" on every load."""
    from speechbrain.dataio.encoder import CategoricalEncoder

    encoder = CategoricalEncoder()
    encoder.expect_len(n_classes)
    return encoder


def add_windows(
    sums: torch.Tensor,
    totals: torch.Tensor,
    window_embeddings: torch.Tensor,
    weights: torch.Tensor,
    owner: torch.Tensor,
) -> None:
    """Add windows' unit embeddings, weighted, to running per-file sums (in place): a file's embedding is
    sums / totals, however many batches its windows came in."""
    unit = torch.nn.functional.normalize(window_embeddings.float(), dim=1)
    sums.index_add_(0, owner, unit * weights.float()[:, None])
    totals.index_add_(0, owner, weights.float())


def host_model(model: SpeakerClassifier, state: dict[str, torch.Tensor]) -> SpeakerClassifier:
    """A new CPU model with `model`'s architecture and the weights `state` (CPU tensors), in eval mode.
    Saving, digesting and validating it never touch the training device (on XLA that would compile)."""
    copy = SpeakerClassifier(ModelConfig(**model.config.to_dict()))
    copy.load_state_dict(state)
    return copy.eval()


def embed_waveforms(
    model: SpeakerClassifier,
    wavs: torch.Tensor,
    lens: torch.Tensor,
    device: torch.device,
    autocast: contextlib.AbstractContextManager | None = None,
) -> torch.Tensor:
    """Embeddings [n, embedding_size] of `model` (already on `device`, in the mode the caller set) for waveforms
    [n, samples] with relative lengths `lens`: features and encoder on `device`, under `autocast` when given
    (the front end stays fp32 whatever it says), returned on the host in fp32."""
    wavs, lens = wavs.to(device, non_blocking=True), lens.to(device, non_blocking=True)
    with autocast if autocast is not None else contextlib.nullcontext():
        embeddings = model.embed(model.features(wavs, lens), lens)
    return embeddings.float().cpu()


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
