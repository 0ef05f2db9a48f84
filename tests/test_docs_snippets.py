"""Docs are code: the commands, Python and TOML in README.md and docs/ are checked against the real CLI and API
(tests/docs_check.py says how), and the tables name only options, defaults and backends the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.conftest import ROOT
from tests.docs_check import check_command, check_page, commands_in

PAGES = [ROOT / "README.md", ROOT / "docker" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_commands_and_snippets_are_what_the_code_accepts(page: Path, tmp_path: Path):
    found = check_page(page, tmp_path)
    assert not found.problems, "what the page shows, the code refuses:\n" + "\n".join(found.problems)


def test_the_check_catches_an_option_the_cli_does_not_have(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("```bash\naitune-export export --concurrency 4 --no-such-option 3\n```\n\n"
                    "```bash\naitune-export export -q  # group options may stand after the subcommand\n"
                    "aitune-export --repository x export\n```\n")
    found = check_page(page, tmp_path)
    assert found.checked == 0 and len(found.problems) == 2
    assert re.search(r"'aitune-export export --concurrency 4 --no-such-option 3': No such option.*--no-such-option", found.problems[0])
    assert re.search(r"'aitune-export --repository x export': No such option.*--repository", found.problems[1])


def test_the_check_reads_commands_as_a_shell_does():
    text = ("make export ARGS=\"--backend onnxruntime\"   # the Makefile's export\n"
            "CI=1 aitune-export backends --json | jq .backends && aitune-export serve model_repository &\n"
            "docker run img sh -c 'aitune-export export --config /x.toml \\\n   --device cuda'\n"
            "$ aitune-export validate model_repository\n"
            "aitune-export export encoder.py:build ... --traffic requests.json\n")
    assert commands_in(text) == [
        ["export", "--overwrite", "--backend", "onnxruntime"],
        ["backends", "--json"], ["serve", "model_repository"],
        ["export", "--config", "/x.toml", "--device", "cuda"],
        ["validate", "model_repository"],
        ["export", "encoder.py:build", "--traffic", "requests.json"],
    ]
    with pytest.raises(AssertionError, match="'fast' is not one of"):
        check_command(["export", "--strategy", "fast"])
    with pytest.raises(AssertionError, match="SignatureError: unknown dtype .float99."):
        check_command(["export", "--input", "x:float99:3"])


def test_a_fence_that_waits_for_an_option_is_skipped_until_it_lands(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text('<!-- skip: next if(not cli_has("export", "--not-yet"), reason="--not-yet has not landed") -->\n\n'
                    "```bash\naitune-export export --not-yet 3\n```\n\n"
                    '<!-- skip: next if(not cli_has("export", "--concurrency"), reason="landed") -->\n\n'
                    "```bash\naitune-export export --concurrency 4\n```\n")
    found = check_page(page, tmp_path)
    assert found.skipped == ["line 3: --not-yet has not landed"] and found.checked == 1 and not found.problems


# --- tables -----------------------------------------------------------------------------------------------------------


def _tables(page: Path) -> list[list[list[str]]]:
    """Every table of a page as rows of cells (the header row first), each cell its source text."""
    tokens = MarkdownIt("commonmark").enable("table").parse(page.read_text())
    tables, rows, row = [], [], None
    for token in tokens:
        if token.type == "table_open":
            rows = []
        elif token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token.content)
        elif token.type == "tr_close":
            rows.append(row)
            row = None
        elif token.type == "table_close":
            tables.append(rows)
    return tables


def _options_in(cell: str) -> list[str]:
    return [o for span in re.findall(r"`([^`]*)`", cell) for o in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", span)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_option_table_names_options_of_one_command(page: Path):
    """A table whose first column is options lists options one command has (the command each table is about)."""
    from optimizer.cli.commands import main

    owned = {name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} for name, cmd in main.commands.items()}
    wrong = []
    for table in _tables(page):
        options = [o for row in table[1:] if row and row[0].lstrip().startswith("`-") for o in _options_in(row[0])]
        if options and not any(set(options) <= have for have in owned.values()):
            best = max(owned, key=lambda n: len(set(options) & owned[n]))
            wrong.append(f"{table[0]}: {sorted(set(options) - owned[best])} are not options of `{best}` (nor is the table "
                         "another command's)")
    assert not wrong, f"{page.name}: " + "\n".join(wrong)


def test_backend_tables_name_the_registry_and_its_platforms():
    """A table whose first column is `backend` names registered backends, each with its own Triton platform."""
    from optimizer.backend import BACKENDS

    wrong, seen = [], 0
    for page in PAGES:
        for table in _tables(page):
            if not table or table[0][0].strip().lower() != "backend":
                continue
            platform_column = next((i for i, h in enumerate(table[0]) if "platform" in h.lower()), None)
            for row in table[1:]:
                name = re.fullmatch(r"`([^`]+)`", row[0].strip())
                if not name:
                    continue
                seen += 1
                if name.group(1) not in BACKENDS:
                    wrong.append(f"{page.name}: {name.group(1)!r} is not a backend (--backend takes {', '.join(BACKENDS)})")
                elif platform_column is not None and BACKENDS[name.group(1)].triton_platform:
                    if f"`{BACKENDS[name.group(1)].triton_platform}`" not in row[platform_column]:
                        wrong.append(f"{page.name}: {name.group(1)} is served as {BACKENDS[name.group(1)].triton_platform!r}, "
                                     f"the table says {row[platform_column]!r}")
    assert seen and not wrong, "\n".join(wrong)


def test_the_settings_table_is_the_one_the_code_generates():
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from settings_table import END, START, table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = (ROOT / "docs" / "exporting.md").read_text()
    shown = page.split(START, 1)[1].split(END, 1)[0].strip()
    assert shown == table(), "docs/exporting.md's settings table is not what ExportSettings says: run scripts/settings_table.py"


def test_the_default_objective_and_the_flow_are_stated_once():
    """One statement each, linked from elsewhere: a second copy drifts from the first."""
    texts = {p: p.read_text() for p in PAGES}
    texts = {p: re.sub(r"<!-- (settings-table|sample:[\w.]+) -->.*?<!-- /\1 -->", "", t, flags=re.S)  # the CLI's help, the program's output
             for p, t in texts.items()}
    objective = [p.name for p, t in texts.items() for _ in re.finditer(r"geometric mean of its throughput", t)]
    flow = [p.name for p, t in texts.items() for _ in re.finditer(r"^#+ The flow$", t, flags=re.M)]
    assert objective == ["choosing-the-load.md"], f"the default objective is stated in {objective}; link to choosing-the-load.md"
    assert flow == ["index.md"], f"the flow is stated in {flow}; link to index.md#the-flow"


def test_readme_links_pages_that_render_where_the_repository_is_read():
    """README's links resolve in the repository, and none is a page made only of MkDocs directives (empty on a code host)."""
    wrong = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text()):
        if "://" in target:
            continue
        path = ROOT / target
        if not path.is_file():
            wrong.append(f"{target}: no such file")
        elif path.suffix == ".md" and not re.search(r"^(?!:::|--8<--|\s{4}|\s*$).+", path.read_text(), flags=re.M):
            wrong.append(f"{target}: only MkDocs directives")
    assert not wrong, wrong
