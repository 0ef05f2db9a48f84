"""`aitune-export validate`: prove a published model in a real Triton before anyone deploys it.

Loads the model into a real tritonserver (a local one started on the repository, or a running one
at --url), sends the samples saved at export time over HTTP and gRPC and compares the answers with
the eager reference (the optimizer's own tolerances), checks that a batch above max_batch_size is
refused, and measures a concurrency sweep with perf_analyzer on real samples, set against the
throughput the optimizer predicted. The outcome is one plain record, written as validation.json
into the export's report folder.

    target.py       the model in REPO, whether the local server can serve it, where the record goes
    expectation.py  what the export left for validation (report.json, samples, prediction)
    client.py       the tritonclient calls (HTTP and gRPC alike)
    checks.py       answers, oversize batch, perf_analyzer window
    record.py       validation.json
    run.py          validate(): the checks in order
"""

from optimizer.triton.measure.validation.expectation import ExportReference, find_export_report, load_export_reference
from optimizer.triton.measure.validation.record import STAND_IN_LABEL, STATUSES, VALIDATION_FILENAME, AnswerCheck, ValidationRecord
from optimizer.triton.measure.validation.run import validate
from optimizer.triton.measure.target import ModelTarget, resolve_target

__all__ = [
    "STAND_IN_LABEL",
    "STATUSES",
    "VALIDATION_FILENAME",
    "AnswerCheck",
    "ExportReference",
    "ModelTarget",
    "ValidationRecord",
    "find_export_report",
    "load_export_reference",
    "resolve_target",
    "validate",
]
