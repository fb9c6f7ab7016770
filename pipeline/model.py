"""The path of the classes that artifacts written before pipeline/core/ existed name in their hyperparams.yaml.

SpeechBrain imports an artifact's classes by the dotted path its recipe gives (pipeline/core/artifact.py): older
artifacts say `pipeline.model.WindowedEncoder` (MemberEncoders, PassThrough, label_encoder), newer ones
pipeline.core.model. Nothing in the project imports this module; tests/core/test_old_artifacts.py loads such an
artifact.
"""

from .core.model import MemberEncoders, PassThrough, WindowedEncoder, label_encoder

__all__ = ["MemberEncoders", "PassThrough", "WindowedEncoder", "label_encoder"]
