"""The answer check before any variant counts: the server answers the export's samples within the export's tolerances.

A served search that measured a config answering wrongly would publish a fast wrong model; the start variant is checked
over the protocol the search uses, by the same check `validate` runs, and by the same measure: the elementwise
tolerances for an fp32 winner, the accuracy gate a bf16 or INT8 winner passed in-process (fp32 tolerances would refuse
a reduced-precision winner that `validate` accepts, and skip the search).
"""

from __future__ import annotations

from pathlib import Path

from optimizer.records.tune_result import TuneResult


def wrong_answers(result: TuneResult, protocol: str, url: str, timeout_s: float, name: str, renamed: dict[str, str], fronted: bool) -> str:
    """"" when model `name` on the server at `url` answers the export's samples within its tolerances, else what was wrong.

    `renamed` maps served tensor names to the exported ones; `fronted` models are called through their ensemble, which
    keeps the exported names."""
    from tritonclient.utils import InferenceServerException

    from optimizer.model.samples import load_feeds
    from optimizer.records.correctness import tolerances_from_json
    from optimizer.triton.runtime.server import open_client, triton_message
    from optimizer.triton.measure.answers import accuracy_gate_of, check_answers
    from optimizer.triton.measure.client import served_config

    reference = result.reference
    back = {} if fronted else {original: served for served, original in renamed.items()}
    feeds = [{back.get(k, k): a for k, a in feed.items()} for feed in load_feeds(Path(reference.feeds))]
    outputs = [{back.get(k, k): a for k, a in out.items()} for out in load_feeds(Path(reference.outputs))]
    client = open_client(protocol, url, timeout_s)
    try:
        check = check_answers(client, protocol, name, served_config(client, name), feeds, outputs, list(reference.points),
                              tolerances_from_json(result.tolerances), accuracy_gate_of(result))
    except (InferenceServerException, OSError) as err:  # its config could not be read back: the server is not serving it
        return f"Triton answered: {triton_message(err)}"
    finally:
        client.close()
    return "" if check.passed else check.error
