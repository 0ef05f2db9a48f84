"""The real output shown in docs/reading-the-report.md: one export of the bundled example, validated, as a user runs it.

    .venv/bin/python scripts/report_sample.py            # run the export (a few minutes), keep its files, rewrite the page
    .venv/bin/python scripts/report_sample.py --render   # report.md again from the kept report.json, by the writer as it is now
    .venv/bin/python scripts/report_sample.py --page     # only rewrite the page from the kept files

The export runs in an empty folder with an empty cache (nothing reused), exactly as `aitune-export export --validate`.
Its report.json, validation.json, report.md, config.pbtxt and console are kept in tests/fixtures/report_sample/ (the test that keeps the
page in step with the report writer reads them there), and the page's marked blocks are rewritten from them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "report_sample"
PAGE = ROOT / "docs" / "reading-the-report.md"
COMMAND = ["export", "--validate"]
"""What the sample runs, after `aitune-export`: the bundled example, published, then validated."""

BLOCKS = {  # marker name in the page -> (kept file, fence language)
    "console": ("console.txt", "console"),
    "report.md": ("report.md", "markdown"),
    "config.pbtxt": ("config.pbtxt", "protobuf"),
}


def run_export() -> None:
    """Run the export in an empty folder and keep what a user reads afterwards."""
    with tempfile.TemporaryDirectory(prefix="aitune-sample-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "AITUNE_EXPORT_CACHE_DIR": str(work / "cache"), "PYTHONDONTWRITEBYTECODE": ""}
        env.pop("CI", None)
        done = subprocess.run([sys.executable, "-m", "optimizer.cli", "-q", *COMMAND], cwd=work, env=env,
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            sys.exit(f"the sample export failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
        SAMPLE.mkdir(parents=True, exist_ok=True)
        report = work / "aitune-reports" / "cnn"
        kept = {name: (report / name).read_text() for name in ("report.json", "validation.json", "report.md")}
        kept["config.pbtxt"] = (work / "model_repository" / "cnn" / "config.pbtxt").read_text()
        kept["console.txt"] = "\n".join([f"$ aitune-export -q {' '.join(COMMAND)}", *done.stderr.splitlines(), *done.stdout.splitlines()]) + "\n"
        for name, text in kept.items():
            (SAMPLE / name).write_text(machine_free(text, work))


def machine_free(text: str, work: Path) -> str:
    """Paths as the user's folder shows them: not this run's scratch folder, this machine's interpreter folder or
    validate's temporary folder (a kept file never names a path of the machine that made it)."""
    import re

    text = text.replace(str(work) + "/", "").replace(str(Path(sys.executable).parent) + "/", "")
    return re.sub(re.escape(tempfile.gettempdir()) + r"/aitune-validate-[^/\s\"]+/", "VALIDATE_WORK/", text)


PLOTS = {"throughput": "throughput.png", "latency": "latency.png", "served_search": "served_search.png"}
"""The plots report.md names (the page shows the text; the images stay with a real report)."""


def render_report_md() -> str:
    """report.md as the report writer renders the kept report.json and validation.json now."""
    import json

    from optimizer.records.report_file import read_report
    from optimizer.report.markdown import render_markdown

    result, _, doc = read_report(SAMPLE / "report.json")
    validation = json.loads((SAMPLE / "validation.json").read_text())
    return render_markdown(result, doc.get("settings", {}), doc.get("published"), validation, PLOTS)


def fence(text: str, language: str) -> str:
    """A fence that the text cannot close (one backtick more than its longest run)."""
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}"


def write_page() -> None:
    """Rewrite the page's marked blocks from the kept files."""
    text = PAGE.read_text()
    for marker, (name, language) in BLOCKS.items():
        body = fence((SAMPLE / name).read_text(), language)
        start, end = f"<!-- sample:{marker} -->", f"<!-- /sample:{marker} -->"
        text, n = re.subn(f"{re.escape(start)}.*?{re.escape(end)}", lambda _: f"{start}\n{body}\n{end}", text, flags=re.S)
        if n != 1:
            sys.exit(f"{PAGE} has no {start} ... {end} block")
    PAGE.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", action="store_true", help="only rewrite the page from the files kept in tests/fixtures/report_sample/")
    parser.add_argument("--render", action="store_true",
                        help="render the kept report.json into report.md with the report writer as it is now (after a change to "
                             "the writer, in seconds), then rewrite the page")
    args = parser.parse_args()
    if args.render:
        (SAMPLE / "report.md").write_text(render_report_md())
    elif not args.page:
        run_export()
    write_page()


if __name__ == "__main__":
    main()
