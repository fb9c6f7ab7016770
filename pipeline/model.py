"""The classes that artifacts written before the package had subpackages name by this path.

An artifact's SpeechBrain recipe (hyperparams.yaml, see pipeline/core/artifact.py) names the project's classes
by their dotted path, and SpeechBrain imports them from there when it loads the artifact. Artifacts written
before pipeline/core/ existed say `pipeline.model.WindowedEncoder`, `pipeline.model.MemberEncoders`,
`pipeline.model.PassThrough` and `pipeline.model.label_encoder`: this module keeps those paths working (new
artifacts name pipeline.core.model). Nothing in the project imports it; tests/core/test_artifact.py loads an
artifact that names the old paths.
"""

from .core.model import MemberEncoders, PassThrough, WindowedEncoder, label_encoder

__all__ = ["MemberEncoders", "PassThrough", "WindowedEncoder", "label_encoder"]
