"""The docs a newcomer reads: every relative link resolves, none narrates history, the README
stays one sitting long, its code names what the code has, and the CLI's help and the docs agree.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

from ckpt_pipeline.cli import build_parser
from ckpt_pipeline.cli_help import EXAMPLES, TOP_EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
# Linked from the docs, so its links must resolve too; it is the client's own reference.
LINKED = [ROOT / "trainer_client" / "README.md"]
README_MAX_LINES = 200

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
MD_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)

# Docs state today's truth; git keeps the history. Each pattern is a way a lab notebook speaks.
HISTORY = [
    re.compile(r"\bissue\s*#?\d+", re.I),
    re.compile(r"\b(?:this|last|previous|earlier|the other) sessions?(?:'s)?\b", re.I),
    re.compile(r"\b(?:earlier|previous|older|first) runs?\b", re.I),
    re.compile(r"\bpreviously\b", re.I),
    re.compile(r"\bas of (?:commit )?[0-9a-f]{7,40}\b", re.I),
    re.compile(r"\b(?:commit|at|after|before) [0-9a-f]{7,40}\b"),
    re.compile(r"\bnew this session\b", re.I),
    re.compile(r"\bother engineers\b", re.I),
]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links in code are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of ``path``'s headings (duplicates numbered as GitHub numbers them)."""
    seen: Counter[str] = Counter()
    found: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(2))
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def links(path: Path) -> list[str]:
    prose = _prose(path.read_text())
    return MD_LINK.findall(prose) + HTML_SRC.findall(prose)


@pytest.mark.parametrize("doc", DOCS + LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(doc: Path) -> None:
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_checker_sees_links_images_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "img.png").write_bytes(b"png")
    doc = tmp_path / "a.md"
    doc.write_text(
        "# A `code` title: here (x)\n[ok](a.md#a-code-title-here-x) ![i](img.png)\n"
        '<img src="gone.png"> `[not](a/link)`\n```\n[nor](this)\n```\n'
    )
    assert links(doc) == ["a.md#a-code-title-here-x", "img.png", "gone.png"]
    assert anchors(doc) == {"a-code-title-here-x"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_narrates_history(doc: Path) -> None:
    found = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        found += [f"line {number}: {m.group(0)!r}" for p in HISTORY for m in p.finditer(line)]
    assert not found, f"{doc.relative_to(ROOT)} narrates history: " + "; ".join(found)


def test_readme_is_read_in_one_sitting() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md: {lines} lines, at most {README_MAX_LINES}"


# -- the code in the docs names what the code has ----------------------------------------------

OURS = ("trainer_client", "ckpt_contract", "ckpt_pipeline")


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    return [
        (f"{doc.relative_to(ROOT)}[{i}]", code)
        for doc in DOCS
        for i, code in enumerate(_python_blocks(doc))
    ]


@pytest.mark.parametrize(("where", "code"), _blocks(), ids=[w for w, _ in _blocks()])
def test_python_in_the_docs_imports_and_calls_what_exists(where: str, code: str) -> None:
    """Every name imported from our packages exists, and every keyword passed to it is one of
    its parameters: a renamed function or argument fails here, not in a reader's job."""
    tree = ast.parse(code, filename=where)
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(OURS):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module}.{alias.name}"
                names[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        target = names.get(node.func.id)
        if target is None:
            continue
        parameters = inspect.signature(target).parameters  # type: ignore[arg-type]
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue
        for keyword in node.keywords:
            assert keyword.arg is None or keyword.arg in parameters, (
                f"{where}: {node.func.id}() has no parameter {keyword.arg!r}"
            )


# -- the CLI's help and the docs read alike ----------------------------------------------------


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _doc_text() -> str:
    return "\n".join(doc.read_text() for doc in DOCS)


def _invocations() -> list[list[str]]:
    """Every ``ckpt-pipeline COMMAND ...`` the docs show, in code blocks or inline code."""
    found = []
    for line in _doc_text().splitlines():
        for piece in re.findall(r"ckpt-pipeline\s+[a-z][a-z-]*[^`#|\n]*", line):
            try:
                words = shlex.split(piece.replace("…", "X").replace("[", " ").replace("]", " "))
            except ValueError:
                words = piece.split()
            found.append(words[1:])
    return found


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """A command's options, those of its own subcommands (``spool send``) included."""
    found = {o for a in parser._actions for o in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def test_every_command_and_option_the_docs_name_exists() -> None:
    commands = _commands()
    wrong = []
    for words in _invocations():
        command = words[0]
        if command not in commands:
            if command not in {"COMMAND"}:
                wrong.append(f"no command {command!r}")
            continue
        options = _options(commands[command])
        wrong += [
            f"{command} has no option {w}"
            for w in words[1:]
            if w.startswith("-") and w.split("=")[0] not in options
        ]
    assert not wrong, "; ".join(sorted(set(wrong)))


def test_every_help_example_is_in_the_docs() -> None:
    text = _doc_text()
    lines = [line for examples in EXAMPLES.values() for line in examples] + list(TOP_EXAMPLES)
    missing = [line for line in lines if line not in text]
    assert not missing, f"--help shows examples the docs do not: {missing}"


def test_every_help_line_is_the_one_the_docs_give() -> None:
    """docs/operations.md's table of commands quotes each command's one-line help."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    table = (ROOT / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| `ckpt-pipeline ([a-z-]+)` \| ([^|]*?) \|", table, re.M)
    assert rows, "docs/operations.md has no table of commands"
    wrong = [
        f"{name}: docs {text!r}, --help {helps.get(name)!r}"
        for name, text in rows
        if helps.get(name) != text
    ]
    wrong += [f"{name}: no row" for name in helps if name not in dict(rows)]
    assert not wrong, "docs/operations.md's command table differs from --help: " + "; ".join(wrong)


# -- every benchmark command BENCHMARKS.md gives runs as written ------------------------------


def _bench_commands() -> list[list[str]]:
    """``python -m bench.NAME ...`` / ``python -m bench NAME ...`` lines of BENCHMARKS.md's code."""
    found = []
    for block in re.findall(r"^```\n(.*?)^```", (ROOT / "BENCHMARKS.md").read_text(), re.S | re.M):
        for line in block.splitlines():
            match = re.search(r"python -m bench(?:\.| )([a-z0-9_]+)(.*)", line.split("#")[0])
            if match:
                found.append([match.group(1), *shlex.split(match.group(2))])
    return found


def _bench_options(name: str, capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The options ``bench.NAME --help`` lists (its own parser, run in-process)."""
    module = importlib.import_module(f"bench.{name}")
    with pytest.raises(SystemExit):
        module.main(["--help"])
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", capsys.readouterr().out))


def test_every_benchmark_command_names_options_the_bench_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = _bench_commands()
    assert len({c[0] for c in commands}) >= 7, "BENCHMARKS.md: a command per benchmark"
    wrong = []
    for name, *words in commands:
        options = _bench_options(name, capsys)
        wrong += [f"bench.{name} {w}" for w in words if w.startswith("-") and w not in options]
    assert not wrong, f"BENCHMARKS.md names options the benches do not have: {wrong}"
