"""README.md and docs/*.md against the code: commands parse, configs validate, links resolve.

What is checked (docs/development.md, "The documentation's checks"):

- every line of a fenced code block that runs ``streamgauge …`` (also ``.venv/bin/streamgauge``,
  after a ``$`` prompt or ``NAME=value`` assignments, continued by ``\\`` or an open quote)
  parses with the real CLI's parser (``streamgauge.cli.build_parser``), without running; a
  ``configs/….yaml`` it names exists;
- every ````yaml`` block is a window config that ``parse_config`` accepts, unless the line
  before its opening fence is ``<!-- not-a-config -->``;
- every relative link resolves to a file, and its ``#anchor`` to a heading of that file;
- README.md stays a manual (at most ``README_MAX_LINES`` lines).

No Spark, no PostgreSQL: the whole module runs in about a second.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamgauge.cli import build_parser
from streamgauge.configs import ConfigError, parse_config

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
NOT_A_CONFIG = "<!-- not-a-config -->"
README_MAX_LINES = 320
SHELL_LANGUAGES = frozenset({"", "sh", "shell", "bash", "console"})

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_COMMAND_START = re.compile(
    r"^\s*(?:[\w.@-]*\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:\S*/)?streamgauge\s"
)
_PROMPT = re.compile(r"^\s*[\w.@-]*\$\s+")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_CONFIG_PATH = re.compile(r"^configs/[\w./-]+\.ya?ml$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it opens, its info string, its text, and the marker."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    not_a_config: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _split(path: Path, text: str | None = None) -> tuple[list[Block], list[tuple[int, str]]]:
    """A document's fenced blocks, and its other lines (number, text) for prose checks."""
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            prose.append((index + 1, lines[index]))
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        before = next((t.strip() for t in reversed(lines[:index]) if t.strip()), "")
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            stripped = lines[end].strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                break
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        blocks.append(
            Block(
                path,
                index + 1,
                opening["info"].lower(),
                "\n".join(body) + "\n",
                before == NOT_A_CONFIG,
            )  # fmt: skip
        )
        index = end + 1
    return blocks, prose


SPLIT = {path: _split(path) for path in DOCUMENTS}
BLOCKS = [block for blocks, _ in SPLIT.values() for block in blocks]


# -- commands -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    where: str
    text: str


def _commands(block: Block) -> list[Command]:
    """The ``streamgauge`` command lines of a shell block, continuations joined."""
    found: list[Command] = []
    lines = block.text.splitlines()
    index = 0
    while index < len(lines):
        if not _COMMAND_START.match(lines[index]):
            index += 1
            continue
        start, text = index, lines[index]
        while True:
            try:
                complete = not text.rstrip().endswith("\\") and bool(shlex.split(text, True))
            except ValueError:  # an open quote: the command goes on
                complete = False
            if complete or index + 1 >= len(lines):
                break
            index += 1
            text = (text.rstrip()[:-1] if text.rstrip().endswith("\\") else text + "\n") + (
                lines[index]
            )
        found.append(Command(f"{block.path.relative_to(ROOT)}:{block.line + 1 + start}", text))
        index += 1
    return found


COMMANDS = [
    command for block in BLOCKS if block.language in SHELL_LANGUAGES for command in _commands(block)
]


def _argv(text: str) -> list[str]:
    """The arguments after ``streamgauge``: prompt and variable assignments dropped."""
    words = shlex.split(_PROMPT.sub("", text, count=1), comments=True)
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    assert words and words[0].rsplit("/", 1)[-1] == "streamgauge", words
    return words[1:]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command_parses(command: Command) -> None:
    argv = _argv(command.text)
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            pytest.fail(f"{command.where}: `{command.text}` does not parse (exit {exit_.code}):\n"
                        f"{errors.getvalue()}")  # fmt: skip
    missing = [a for a in argv if _CONFIG_PATH.match(a) and not (ROOT / a).is_file()]
    assert not missing, f"{command.where}: no such config file: {missing}"


# -- configs --------------------------------------------------------------------------------------

CONFIGS = [b for b in BLOCKS if b.language in ("yaml", "yml") and not b.not_a_config]


@pytest.mark.parametrize("block", CONFIGS, ids=[b.where for b in CONFIGS])
def test_yaml_block_is_a_valid_config(block: Block) -> None:
    try:
        parse_config(block.text, block.where)
    except ConfigError as error:
        pytest.fail(
            f"{block.where}: this yaml block is not a valid streamgauge config (mark it with "
            f"{NOT_A_CONFIG} on the line before the fence if it is not meant to be one):\n{error}"
        )


# -- links ----------------------------------------------------------------------------------------


def heading_slug(text: str) -> str:
    """GitHub's anchor for a heading: rendered text, lowercased, punctuation dropped, spaces
    as ``-`` (duplicates get ``-1``, ``-2``: see ``anchors``)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings."""
    return _anchors(SPLIT[path][1] if path in SPLIT else _split(path)[1])


def _anchors(prose: list[tuple[int, str]]) -> set[str]:
    """Heading anchors, repeated ones numbered as GitHub does (``x``, ``x-1``, ...)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose:
        heading = _HEADING.match(line)
        if heading is None:
            continue
        slug = heading_slug(heading["text"])
        count = counts.get(slug, 0)
        counts[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@dataclass(frozen=True)
class Link:
    where: str
    source: Path
    target: str


def _links(path: Path) -> list[Link]:
    found: list[Link] = []
    for number, line in SPLIT[path][1]:
        for match in _LINK.finditer(_INLINE_CODE.sub("", line)):
            target = match["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            found.append(Link(f"{path.relative_to(ROOT)}:{number}", path, target))
    return found


LINKS = [link for path in DOCUMENTS for link in _links(path)]


@pytest.mark.parametrize("link", LINKS, ids=[f"{x.where}:{x.target}" for x in LINKS])
def test_relative_link_resolves(link: Link) -> None:
    file_part, _, anchor = link.target.partition("#")
    target = (link.source.parent / file_part).resolve() if file_part else link.source
    assert target.exists(), f"{link.where}: {link.target} -> {target} does not exist"
    if not anchor:
        return
    assert target.suffix == ".md", (
        f"{link.where}: an anchor into a non-Markdown file: {link.target}"
    )
    assert anchor in anchors(target), (
        f"{link.where}: {target.relative_to(ROOT)} has no heading #{anchor}; its anchors: "
        f"{sorted(anchors(target))}"
    )


# -- the checks find what they check --------------------------------------------------------------


def test_the_checks_are_not_vacuous() -> None:
    assert len(COMMANDS) >= 15, [c.where for c in COMMANDS]
    assert len(CONFIGS) >= 5, [b.where for b in CONFIGS]
    assert len(LINKS) >= 40, [x.where for x in LINKS]
    assert {p.name for p in DOCUMENTS} >= {"README.md", "concepts.md", "development.md"}


def test_the_readers_themselves() -> None:
    """Markers, languages, continued commands and repeated headings, on a made-up page."""
    page = (
        "# Title `x`\n## Title `x`\n<!-- not-a-config -->\n\n```yaml\na: 1\n```\n"
        "```sh\n$ FOO=1 .venv/bin/streamgauge query \\\n  --json 'select\n 1'\n"
        "echo streamgauge\n```\n[a](#title-x-1)\n"
    )
    blocks, prose = _split(ROOT / "README.md", page)
    assert [(b.language, b.not_a_config) for b in blocks] == [("yaml", True), ("sh", False)]
    (command,) = _commands(blocks[1])
    assert _argv(command.text) == ["query", "--json", "select\n 1"]
    titles = [_HEADING.match(line) for _, line in prose]
    assert [heading_slug(t["text"]) for t in titles if t] == ["title-x", "title-x"]
    assert _anchors(prose) == {"title-x", "title-x-1"}
    assert prose[-1] == (14, "[a](#title-x-1)")


def test_readme_stays_a_manual() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it a manual (at most {README_MAX_LINES}) and move "
        "depth into docs/"
    )
