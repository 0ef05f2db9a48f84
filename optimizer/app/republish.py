"""The republish use case: `aitune-export publish REPORT.json` re-emits a finished run's repository, no tuning."""

from __future__ import annotations

from pathlib import Path

from optimizer.errors import PublishError
from optimizer.machine import cache_root
from optimizer.records.report_file import read_report
from optimizer.records.served_search import ServedSearch
from optimizer.triton.repository.publish import PublishOptions, check_options, publish, repository_argument
from optimizer.triton.repository.atomic import Published, check_model_name


def republish(report: Path, repository: Path | str | None = None, name: str | None = None, version: int | None = None,
              overwrite: bool | None = None, template_dir: Path | None = None, warmup: bool | None = None) -> Published:
    """`aitune-export publish REPORT.json`: re-emit the repository of a finished run without re-tuning.

    `repository` may be a folder or an s3:// URL. Options left None come from the run's settings; the artifacts the report names must still exist. The
    operating point the run's served search chose is published again (no server is started).
    """
    result, settings, doc = read_report(report)
    recorded = (doc.get("published") or {}).get("served_search")
    search = ServedSearch.from_json(recorded) if recorded else None
    if result.selected is None:
        raise PublishError(f"the run in {report} selected no candidate, so there is nothing to publish; see its candidates' reasons.")
    templates = template_dir or (Path(settings.template_dir) if settings.template_dir else None)
    options = PublishOptions(
        repository=repository_argument(repository or settings.repository),
        name=name or settings.name or result.model_name,
        version=version,
        overwrite=bool(overwrite),
        warmup=settings.warmup if warmup is None else warmup,
        template_dir=templates,
        report_dir=report.parent,
        operating_point=search.chosen if search is not None and search.status == "searched" else None,
        served_search=search,
        cache_dir=cache_root(settings.cache_dir),
        io_names=settings.io_names,
    )
    check_model_name(options.name)
    check_options(options)
    return publish(result, options)
