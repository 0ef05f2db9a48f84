"""Triton's load-time rules, checked on the parsed config before anything is written (each from the source named below).

One module per rule family, each rule a function named as the rule; check.py runs them all, core's first.
Each rule quotes the wording of the component that enforces it, so a user who has seen the server's error
recognizes it, and says (a short comment) which source release it was read from:
- "Triton core": core src/model_config_utils.cc (ValidateModelConfig, ValidateInstanceGroup, ValidateModelIOConfig/
  ValidateBatchIO, the sequence-control getters, ValidateEnsembleSchedulingConfig) and the repository manager; `gpus`
  ids are checked against this machine's GPU count. tests/test_triton_core_agreement.py loads every broken config into
  the real tritonserver 2.51 and checks that its log says the same words.
- a backend ("ONNX Runtime backend", "PyTorch backend", "TensorRT backend", "OpenVINO backend"): its source, checked
  against facts read from the artifact (ONNX graph, engine profiles; facts.py).
- "aitune-export": checks of our own where the server's failure would come later (at warmup or at the first request).

Covered as far as the config alone decides: I/O, batching, sequence-batching controls, batch_input/batch_output,
ensemble_scheduling, response cache, instance groups, warmup, model_metrics (two scheduling choices at once never get
here: the parser refuses them, as Triton's does). Not covered: ensemble steps against the
composing models' configs, sequence `state` initial data, and backend checks needing facts we do not read (ONNX
dtypes, TorchScript signatures, OpenVINO IR).
"""

from optimizer.triton.config.rules.base import CORE, ArtifactFacts, RuleViolation
from optimizer.triton.config.rules.check import RULES, check, violations, warnings
from optimizer.triton.config.rules.facts import facts_for, local_gpu_count

__all__ = ["CORE", "RULES", "ArtifactFacts", "RuleViolation", "check", "facts_for", "local_gpu_count", "violations", "warnings"]
