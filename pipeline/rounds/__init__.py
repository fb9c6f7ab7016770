"""The train notebook's stage above training and inference: what one run of it does, in rounds.

self_training.py   rounds of self-training and distillation: a teacher (the last round's model, an
                   artifact, or a targets file) scores the unlabelled soundscapes and the training
                   recordings with the infer stage's own calls, and the next model trains on them
pretrained.py      a pretrained model as the teacher (BirdNET v2.4, or a folder such as Perch's): its
                   targets files, its class map, and its seal in the artifact for the infer stage to blend
"""
