"""The documentation site (``docs/``, built by ``mkdocs build --strict``): every code block on a
page is executed by a test or copied from a file that is.

How each fenced block of every page is held to that, by its language:

``python``
    Executed here: every block of the site in one subprocess, each in a fresh namespace with a
    scratch working directory per page (so ``sqlite:///shop.sqlite3`` is a file of its own). A
    block preceded by ``<!-- docs-test: continue -->`` runs in the namespace of the block before
    it. Other forms:

    * only ``--8<-- "FILE"`` lines (pymdownx.snippets): the page shows FILE, which must be run by
      a test (:data:`TESTED`), and a ``FILE:section`` must have its markers;
    * ``<!-- docs-test: excerpt FILE -->``: every line of the block is a line of FILE, in order
      (one indentation level may be dropped): a copy of a file a test runs;
    * ``<!-- docs-test: skip REASON -->``: not run (a block that needs a running broker); at
      most :data:`MAX_SKIPPED` in the whole site, each with its reason.

``text``
    Prose that is not code: a diagram, a URL's grammar, an error message. Preceded by
    ``<!-- docs-test: output -->`` it is what the Python block before it prints, compared here.

``bash``, ``console``, ``sh``, ``shell``
    Every command is checked without running it. ``sqla-outbox ...`` must parse against the real
    click command (``make_context``, so a renamed flag, a bad value or an unknown subcommand
    fails); ``pip install`` may name only extras that ``pyproject.toml`` defines; any other
    program must be on :data:`ALLOWED_PROGRAMS`.

``ini``, ``dockerfile``, ``yaml``
    Only includes of files under ``examples/deploy/``, which the tests below check: the systemd
    unit's ``ExecStart``, the image's command and the Kubernetes container's arguments (with their
    environment) parse as ``sqla-outbox relay``, and the probes ask the metrics port for
    ``/healthz``.

Any other language, or none, fails. Besides: every snippet include resolves; ``mkdocs.yml``'s nav
and ``docs/`` hold the same pages; every ``::: identifier`` of the API reference imports; the
consumers of ``examples/consuming.py`` deduplicate each bundled publisher's real wire format; and
no page speaks of the work's history (sessions of work, issue numbers).

Nothing here needs PostgreSQL, a broker or the network (the webhook consumer listens on
127.0.0.1).
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import datetime as dt
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import click
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from sqla_outbox import OutboxMessage, inbox
from sqla_outbox.cli import cli

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DEPLOY = REPO / "examples" / "deploy"

TESTED = {
    "examples/quickstart.py": ("tests/test_examples.py", '"quickstart.py"'),
    "examples/fastapi_app.py": ("tests/test_examples.py", '"fastapi_app"'),
    "examples/alembic/": ("tests/test_alembic_ext.py", '"examples" / "alembic"'),
    "examples/consuming.py": ("tests/test_docs.py", "test_every_consumer_processes_a_message_once"),
}
"""Files (or folders) a page may include or excerpt -> the test module that runs them, and a string
that module holds because it does."""

MAX_SKIPPED = 2
"""Python blocks the whole site may leave unrun (``<!-- docs-test: skip REASON -->``)."""

ALLOWED_PROGRAMS = frozenset(
    {
        "alembic",
        "celery",
        "export",
        "journalctl",
        "kubectl",
        "nats",
        "pytest",
        "systemctl",
        "uvicorn",
    }
)
"""Programs a shell block may run besides ``sqla-outbox``, ``pip`` and ``python``."""

PYTHON_MODULES = frozenset({"benchmarks", "venv", "pip", "sqla_outbox"})
"""What ``python -m`` may run in a shell block."""

SHELL = frozenset({"bash", "console", "sh", "shell"})
DEPLOY_LANGUAGES = frozenset({"ini", "dockerfile", "yaml"})

HISTORY = re.compile(
    r"\b(?:this|last|previous|earlier|next|latest|"
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"(?:twenty|thirty)-?\w*|\d+(?:st|nd|rd|th))\s+session\b"
    r"|\bsession\s+\d+\b"
    r"|\b(?:issue|PR|pull request)\s*#?\s*\d+\b",
    re.IGNORECASE,
)
"""Words about the work's history rather than the product: "this session", "the eleventh
session", "issue #3". ``session`` in SQLAlchemy's sense stays allowed."""

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)(?P<rest>.*)$"
)
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>[\w-]+)\s*(?P<arg>.*?)\s*-->$")
_INCLUDE = re.compile(r"""^\s*-{1,2}8<-{1,2}\s+(?P<quote>["'])(?P<spec>[^"']+)(?P=quote)\s*$""")
_NAV_PAGE = re.compile(r"^\s*-\s*(?:[^:\n]+:\s*)?(?P<page>[\w./-]+\.md)\s*$", re.MULTILINE)
_PLACEHOLDER_URL = "postgresql+psycopg://relay@db.internal/app"


# -- reading the pages ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # relative to docs/
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    marker: str | None  # the docs-test marker's kind just before the fence
    marker_arg: str

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def includes(self) -> list[str]:
        """The snippet specs of a block made only of ``--8<--`` lines, else []."""
        lines = [line for line in self.body.splitlines() if line.strip()]
        matches = [_INCLUDE.match(line) for line in lines]
        if not lines or not all(matches):
            return []
        return [match.group("spec") for match in matches if match]


def pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if "_hooks" not in path.parts)


def page_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        assert end < len(lines), f"{path}:{index + 1}: a code block that never closes"
        body = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end])
        before = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        marker = _MARKER.match(before)
        blocks.append(
            Block(
                page=path.relative_to(DOCS).as_posix(),
                line=index + 1,
                lang=opening.group("lang").lower(),
                body=body + "\n",
                marker=marker.group("kind") if marker else None,
                marker_arg=marker.group("arg") if marker else "",
            )
        )
        index = end + 1
    return blocks


ALL_BLOCKS = [block for path in pages() for block in page_blocks(path)]


def blocks_in(languages: frozenset[str] | set[str]) -> list[Block]:
    return [block for block in ALL_BLOCKS if block.lang in languages]


def by_place(blocks: list[Block]) -> Any:
    return pytest.mark.parametrize("block", blocks, ids=[block.where for block in blocks])


# -- files a page may show ------------------------------------------------------------------------


def runner_of(path: str) -> tuple[str, str] | None:
    for prefix, test in TESTED.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return test
    return None


def check_tested(path: str, where: str) -> None:
    """``path`` is a file some test runs, and that test says so."""
    if path.startswith("examples/deploy/"):
        return  # checked by the deployment tests below
    test = runner_of(path)
    assert test is not None, (
        f"{where} shows {path}, which no test runs: include a file of TESTED (tests/test_docs.py), "
        "or add the test that runs it there"
    )
    module, evidence = test
    assert evidence in (REPO / module).read_text(encoding="utf-8"), (
        f"{where} shows {path} as run by {module}, which no longer mentions {evidence!r}"
    )


def resolve_include(spec: str, where: str) -> Path:
    """The file of a snippet spec (``path``, ``path:section`` or ``path:start:end``), checked."""
    path, _, selector = spec.partition(":")
    file = REPO / path
    assert file.is_file(), f'{where}: --8<-- "{spec}" names {path}, which does not exist'
    if selector and not selector.replace(":", "").isdigit():
        text = file.read_text(encoding="utf-8")
        for end in ("start", "end"):
            assert f"--8<-- [{end}:{selector}]" in text, (
                f'{where}: --8<-- "{spec}": {path} has no "--8<-- [{end}:{selector}]" marker'
            )
    return file


def test_every_include_resolves() -> None:
    """Every ``--8<--`` line of every page names an existing file (and section), wherever it is."""
    for path in pages():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            include = _INCLUDE.match(line)
            if include:
                resolve_include(include.group("spec"), f"docs/{path.relative_to(DOCS)}:{number}")


# -- every block is one of the kinds above --------------------------------------------------------


@by_place(ALL_BLOCKS)
def test_every_block_has_a_known_kind(block: Block) -> None:
    known = {"python", "text", *SHELL, *DEPLOY_LANGUAGES}
    assert block.lang in known, (
        f"{block.where}: a ```{block.lang or '(no language)'} block; tag it python, text, bash "
        f"or console, or include a file of examples/deploy/ as {sorted(DEPLOY_LANGUAGES)}"
    )
    if block.marker is not None:
        assert block.marker in {"continue", "excerpt", "output", "skip"}, (
            f"{block.where}: unknown marker docs-test: {block.marker}"
        )
        expected = "text" if block.marker == "output" else "python"
        assert block.lang == expected, (
            f"{block.where}: docs-test: {block.marker} on a {block.lang} block"
        )


@by_place(blocks_in(DEPLOY_LANGUAGES))
def test_config_blocks_come_from_the_deployment_examples(block: Block) -> None:
    specs = block.includes
    assert specs, (
        f"{block.where}: a {block.lang} block must only include a file of examples/deploy/"
    )
    for spec in specs:
        file = resolve_include(spec, block.where)
        assert file.parent == DEPLOY, f"{block.where}: {spec} is not in examples/deploy/"


@by_place([block for block in blocks_in({"python"}) if block.includes or block.marker == "excerpt"])
def test_copied_python_comes_from_a_tested_file(block: Block) -> None:
    if block.includes:
        for spec in block.includes:
            resolve_include(spec, block.where)
            check_tested(spec.partition(":")[0], block.where)
        return
    source = block.marker_arg
    assert source, f"{block.where}: docs-test: excerpt needs the file it is copied from"
    check_tested(source, block.where)
    assert is_excerpt(block.body, (REPO / source).read_text(encoding="utf-8")), (
        f"{block.where} is no longer a copy of {source}: every line of it must be a line of "
        f"{source}, in the same order (one indentation level may be dropped)"
    )


def is_excerpt(block: str, source: str) -> bool:
    """Every non-blank line of ``block`` is a line of ``source``, in order, all with the same
    extra indentation there (0, 4 or 8 spaces)."""
    wanted = [line.rstrip() for line in textwrap.dedent(block).splitlines() if line.strip()]
    lines = [line.rstrip() for line in source.splitlines()]
    for indent in ("", " " * 4, " " * 8):
        remaining = iter(lines)
        if all(indent + line in remaining for line in wanted):
            return True
    return False


def test_few_blocks_are_skipped() -> None:
    skipped = [block for block in blocks_in({"python"}) if block.marker == "skip"]
    for block in skipped:
        assert block.marker_arg, f"{block.where}: docs-test: skip needs its reason"
    assert len(skipped) <= MAX_SKIPPED, (
        f"{len(skipped)} Python blocks are not run ({', '.join(b.where for b in skipped)}); "
        f"at most {MAX_SKIPPED}: move the code into a file a test runs"
    )


# -- running the Python blocks --------------------------------------------------------------------

_RUNNER = r"""
import contextlib, io, json, os, sys, traceback, types
spec = json.load(sys.stdin)
results = {}
modules = 0
for page in spec["pages"]:
    workdir = os.path.join(spec["root"], page["slug"])
    os.makedirs(workdir)
    os.chdir(workdir)
    namespace = None
    for block in page["blocks"]:
        if not block["continue"] or namespace is None:
            modules += 1
            module = types.ModuleType(f"docs_block_{modules}")
            sys.modules[module.__name__] = module  # SQLAlchemy resolves annotations through it
            namespace = module.__dict__
        out = io.StringIO()
        try:
            code = compile(block["code"], block["where"], "exec")
            with contextlib.redirect_stdout(out):
                exec(code, namespace)
        except BaseException:
            results[block["where"]] = {"ok": False, "stdout": out.getvalue(),
                                       "error": traceback.format_exc()}
            namespace = None  # a block continuing this one would fail for the wrong reason
        else:
            results[block["where"]] = {"ok": True, "stdout": out.getvalue()}
with open(spec["results"], "w") as handle:
    json.dump(results, handle)
"""


def runnable(block: Block) -> bool:
    return block.lang == "python" and not block.includes and block.marker not in {"excerpt", "skip"}


RUN_BLOCKS = [block for block in ALL_BLOCKS if runnable(block)]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every runnable Python block of the site, run once, by where it is."""
    root = tmp_path_factory.mktemp("docs")
    results = root / "results.json"
    by_page: dict[str, list[Block]] = {}
    for block in RUN_BLOCKS:
        by_page.setdefault(block.page, []).append(block)
    spec = {
        "root": str(root / "pages"),
        "results": str(results),
        "pages": [
            {
                "slug": page.replace("/", "_").removesuffix(".md"),
                "blocks": [
                    {
                        "where": block.where,
                        "code": block.body,
                        "continue": block.marker == "continue",
                    }
                    for block in blocks
                ],
            }
            for page, blocks in by_page.items()
        ],
    }
    environment = {key: value for key, value in os.environ.items() if not key.startswith("SQLA_")}
    process = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=root,
        env=environment,
    )
    assert process.returncode == 0, process.stderr
    return dict(json.loads(results.read_text()))


@by_place(RUN_BLOCKS)
def test_python_block_runs(block: Block, ran: dict[str, dict[str, Any]]) -> None:
    result = ran[block.where]
    assert result["ok"], f"{block.where} raised:\n{result['error']}"


OUTPUT_BLOCKS = [block for block in ALL_BLOCKS if block.marker == "output"]


@by_place(OUTPUT_BLOCKS)
def test_output_block_is_what_the_code_prints(block: Block, ran: dict[str, dict[str, Any]]) -> None:
    before = [b for b in ALL_BLOCKS if b.page == block.page and b.line < block.line]
    assert before, f"{block.where}: an output block with no code before it"
    code = before[-1]
    assert code.where in ran, f"{block.where}: the block before it ({code.where}) is not run"
    assert ran[code.where]["stdout"] == block.body, (
        f"{code.where} printed:\n{ran[code.where]['stdout']}but {block.where} shows:\n{block.body}"
    )


# -- shell commands -------------------------------------------------------------------------------


def command_lines(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined; in a console block only the
    ``$ `` lines (the rest is output)."""
    text = re.sub(r"\\\n\s*", " ", block.body)
    lines = text.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def split_commands(line: str) -> list[list[str]]:
    """``line``'s commands, split at ``&&``, ``||``, ``;`` and ``|``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def check_command(argv: list[str], where: str, env: dict[str, str] | None = None) -> None:
    """One shell command, checked without running it (see the module docs)."""
    env = dict(env or {})
    while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
        name, _, value = argv[0].partition("=")
        env[name] = value
        argv = argv[1:]
    if not argv:
        return  # only variable assignments
    program = Path(argv[0]).name
    if program == "sqla-outbox":
        parse_cli(argv[1:], where, env)
    elif program in {"python", "python3"}:
        check_python(argv[1:], where, env)
    elif program == "pip":
        check_pip(argv[1:], where)
    else:
        assert program in ALLOWED_PROGRAMS, (
            f"{where}: `{shlex.join(argv)}`: {program} is not a command the docs may show "
            "(ALLOWED_PROGRAMS in tests/test_docs.py)"
        )
        if program == "kubectl" and "-f" in argv:
            manifest = argv[argv.index("-f") + 1]
            assert (REPO / manifest).is_file(), f"{where}: kubectl applies {manifest}, missing"


def check_python(args: list[str], where: str, env: dict[str, str]) -> None:
    if args[:1] == ["-m"]:
        module = args[1]
        assert module in PYTHON_MODULES, f"{where}: python -m {module} is not allowed"
        if module == "sqla_outbox":
            parse_cli(args[2:], where, env)
        return
    script = next((arg for arg in args if not arg.startswith("-")), None)
    assert script is not None and (REPO / script).is_file(), f"{where}: python runs {script}"


def pyproject_extras() -> set[str]:
    """The extras ``pyproject.toml`` defines (read as text: ``tomllib`` is Python 3.11+)."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*=", section, re.MULTILINE))


def check_pip(args: list[str], where: str) -> None:
    extras = pyproject_extras()
    for arg in args:
        match = re.fullmatch(r"(?:sqla-outbox|\.)\[(?P<extras>[^\]]+)\](?:[<>=!~].*)?", arg)
        if match:
            named = {extra.strip() for extra in match.group("extras").split(",")}
            assert named <= extras, f"{where}: pip install {arg}: no extra {sorted(named - extras)}"


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Exactly ``env`` among the ``SQLA_OUTBOX_*`` variables, for the length of the block."""
    saved = {key: value for key, value in os.environ.items() if key.startswith("SQLA_OUTBOX_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key in env:
            os.environ.pop(key, None)
        os.environ.update(saved)


def subcommand(args: list[str]) -> tuple[click.Command, str, list[str]]:
    """The click command ``sqla-outbox ARGS`` runs, its name, and the arguments left for it."""
    command: click.Command = cli
    name = "sqla-outbox"
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        found = command.commands.get(args[0])
        assert found is not None, f"sqla-outbox has no command {' '.join([name, args[0]])!r}"
        command, name, args = found, args[0], args[1:]
    return command, name, args


def parse_cli(args: list[str], where: str, env: dict[str, str]) -> click.Context | None:
    """Parse ``sqla-outbox ARGS`` with the real command, its environment variables included, and
    run nothing. ``None`` for ``--help`` and ``--version``."""
    command, name, rest = subcommand(args)
    sqla_env = {key: value for key, value in env.items() if key.startswith("SQLA_OUTBOX_")}
    with environment(sqla_env), contextlib.redirect_stdout(io.StringIO()):
        try:
            return command.make_context(name, list(rest), resilient_parsing=False)
        except click.exceptions.Exit:
            return None
        except click.ClickException as error:
            pytest.fail(f"{where}: `sqla-outbox {shlex.join(args)}`: {error.format_message()}")


@by_place(blocks_in(SHELL))
def test_shell_commands_are_real(block: Block) -> None:
    lines = command_lines(block)
    assert lines, f"{block.where}: a shell block without a command"
    for line in lines:
        for argv in split_commands(line):
            check_command(argv, block.where)


def test_a_renamed_flag_fails_the_check() -> None:
    """The check above is real: a flag the command does not have is caught."""
    check_command(["sqla-outbox", "relay", "--metrics-port", "9100"], "here")
    with pytest.raises(pytest.fail.Exception, match="no-such-flag"):
        check_command(["sqla-outbox", "relay", "--no-such-flag"], "here")
    with pytest.raises(pytest.fail.Exception, match="metrics-port"):
        check_command(["sqla-outbox", "relay"], "here", {"SQLA_OUTBOX_METRICS_PORT": "no"})
    with pytest.raises(AssertionError, match="no command"):
        check_command(["sqla-outbox", "relays"], "here")


def prose(path: Path) -> str:
    """``path``'s text without its fenced code blocks."""
    kept: list[str] = []
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group("fence")
        elif (
            fence is not None
            and line.strip().startswith(fence)
            and not line.strip().strip(fence[0])
        ):
            fence = None
        elif fence is None:
            kept.append(line)
    return "\n".join(kept)


def inline_code(path: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(path))


def cli_flags(command: click.Command = cli) -> set[str]:
    """Every option of every ``sqla-outbox`` command."""
    flags = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for sub in getattr(command, "commands", {}).values():
        flags |= cli_flags(sub)
    return flags


FOREIGN_FLAGS = frozenset({"--autogenerate", "--sql", "--pool", "--workers"})
"""Flags of other programs that pages name in running text: alembic's, ``celery worker``'s and
uvicorn's."""

OWN_FLAGS_ONLY = [path for path in pages() if path.name != "performance.md"]
"""Pages whose ``--flags`` in running text are sqla-outbox's (the performance page's are the
benchmark suite's)."""


@pytest.mark.parametrize("path", pages(), ids=lambda path: str(path.relative_to(REPO)))
def test_commands_in_running_text_are_real(path: Path) -> None:
    """An inline ``sqla-outbox ...`` parses like a shell block's (placeholders such as ``<url>``
    stand for a value; a span showing alternatives or an ellipsis is a summary, not a command)."""
    where = f"docs/{path.relative_to(DOCS)}"
    for code in inline_code(path):
        if not code.startswith("sqla-outbox ") or re.search(r"\||\.\.\.|…", code):
            continue
        parse_cli(shlex.split(re.sub(r"<[^>]+>", "x", code))[1:], where, {})


@pytest.mark.parametrize("path", OWN_FLAGS_ONLY, ids=lambda path: str(path.relative_to(REPO)))
def test_flags_in_running_text_exist(path: Path) -> None:
    """A ``--flag`` a page names in running text is an option of some sqla-outbox command, so a
    renamed flag cannot linger in prose."""
    known = cli_flags() | FOREIGN_FLAGS | {"--help", "--version"}
    named = {
        match
        for code in inline_code(path)
        for match in re.findall(r"(?<![\w-])--[a-z][\w-]*", code)
    }
    assert named <= known, f"docs/{path.relative_to(DOCS)} names {sorted(named - known)}"


# -- the deployment examples ----------------------------------------------------------------------


def relay_envvars() -> set[str]:
    command, _, _ = subcommand(["relay"])
    return {
        name
        for param in command.params
        for name in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or [])
    }


def env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


def check_relay(argv: list[str], env: dict[str, str], where: str) -> click.Context:
    """``argv`` is ``sqla-outbox relay ...`` and parses with ``env``; every ``SQLA_OUTBOX_*``
    variable of ``env`` is one the relay reads."""
    assert Path(argv[0]).name == "sqla-outbox" and argv[1] == "relay", f"{where}: runs {argv}"
    unknown = {name for name in env if name.startswith("SQLA_OUTBOX_")} - relay_envvars()
    assert not unknown, f"{where}: sqla-outbox relay reads no variable {sorted(unknown)}"
    context = parse_cli(argv[1:], where, env)
    assert context is not None
    return context


def test_systemd_unit_runs_the_relay() -> None:
    units = sorted(DEPLOY.glob("*.service"))
    assert units, "examples/deploy/ has no systemd unit"
    for unit in units:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(unit)
        service = parser["Service"]
        env: dict[str, str] = {}
        if "EnvironmentFile" in service:
            named = Path(service["EnvironmentFile"].lstrip("-"))
            local = DEPLOY / named.name
            assert local.is_file(), (
                f"{unit.name} reads {named}; examples/deploy/{named.name} is missing"
            )
            env = env_file(local)
        context = check_relay(shlex.split(service["ExecStart"]), env, unit.name)
        assert context.params["url"], f"{unit.name}: no database URL (--url or SQLA_OUTBOX_URL)"
        assert service.get("KillSignal", "SIGTERM") in {"SIGTERM", "SIGINT"}
        assert "2" in service.get("RestartPreventExitStatus", "").split(), (
            f"{unit.name}: exit status 2 (a bad option) should not be restarted"
        )


def dockerfile_command() -> tuple[list[str], list[str], set[int]]:
    text = (DEPLOY / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD\s+(\[.*\])$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    exposed = {int(port) for port in re.findall(r"^EXPOSE\s+(\d+)", text, re.MULTILINE)}
    return entrypoint, command, exposed


def test_container_image_runs_the_relay() -> None:
    entrypoint, command, exposed = dockerfile_command()
    context = check_relay(entrypoint + command, {"SQLA_OUTBOX_URL": _PLACEHOLDER_URL}, "Dockerfile")
    assert context.params["metrics_port"] in exposed, (
        "the image exposes another port than /healthz's"
    )


def test_kubernetes_probes_ask_the_relay_for_healthz() -> None:
    yaml = pytest.importorskip(
        "yaml"
    )  # mkdocs brings PyYAML; without it the include still resolves
    entrypoint, _, _ = dockerfile_command()
    documents = [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if doc]
    containers = [
        container
        for doc in documents
        if doc["kind"] == "Deployment"
        for container in doc["spec"]["template"]["spec"]["containers"]
    ]
    assert containers, "kubernetes.yaml has no Deployment container"
    for container in containers:
        env = {
            item["name"]: str(item["value"]) if "value" in item else _PLACEHOLDER_URL
            for item in container.get("env", [])
        }
        argv = container.get("command", entrypoint) + container.get("args", [])
        context = check_relay(argv, env, f"kubernetes.yaml container {container['name']}")
        port = context.params["metrics_port"]
        assert port is not None, "the relay serves no /healthz: pass --metrics-port"
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] == "/healthz", f"{probe} asks {get['path']}"
            assert ports.get(get["port"], get["port"]) == port, f"{probe} asks another port"


# -- the consumers of examples/consuming.py -------------------------------------------------------


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"docs_example_{name}", REPO / "examples" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # SQLAlchemy resolves the Mapped[...] annotations through it
    spec.loader.exec_module(module)
    return module


class _FakeRedis:
    def __init__(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        self.entries = entries
        self.acked: list[str] = []

    def xreadgroup(self, group: str, consumer: str, streams: dict[str, str], **_: Any) -> Any:
        [(stream, position)] = streams.items()
        assert position == ">"
        return [(stream, self.entries)]

    def xack(self, stream: str, group: str, entry_id: str) -> None:
        self.acked.append(entry_id)


class _FakeNatsMessage:
    def __init__(self, headers: dict[str, str], data: bytes, acked: list[bool]) -> None:
        self.headers, self.data, self._acked = headers, data, acked

    async def ack(self) -> None:
        self._acked.append(True)


class _FakeJetStream:
    def __init__(self, messages: list[_FakeNatsMessage]) -> None:
        self.messages = messages

    async def pull_subscribe(self, subject: str, **_: Any) -> Any:
        messages = self.messages

        class Subscription:
            async def fetch(self, batch: int, timeout: float) -> list[_FakeNatsMessage]:
                return messages[:batch]

        return Subscription()


class _FakeKafkaRecord:
    def __init__(self, headers: list[tuple[str, bytes]], value: bytes) -> None:
        self._headers, self._value = headers, value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def value(self) -> bytes:
        return self._value

    def error(self) -> None:
        return None


class _FakeKafkaConsumer:
    def __init__(self, records: list[_FakeKafkaRecord]) -> None:
        self.records = list(records)
        self.committed: list[_FakeKafkaRecord] = []

    def poll(self, timeout: float) -> _FakeKafkaRecord | None:
        return self.records.pop(0) if self.records else None

    def commit(self, *, message: _FakeKafkaRecord, asynchronous: bool) -> None:
        assert asynchronous is False
        self.committed.append(message)


def _serve_webhook(handle: Any) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(handle(self.headers, body))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/in"


@dataclass
class Consumers:
    """examples/consuming.py on a fresh SQLite database, and the effects its consumers ran."""

    module: Any
    sessions: sessionmaker[Any]
    done: list[Any]

    def message(self, broker: str) -> OutboxMessage:
        now = dt.datetime.now(dt.timezone.utc)
        return OutboxMessage(
            uuid.uuid4(),
            "billing.send_receipt",
            "emails",
            {"order_id": 42},
            f"{broker}-42",
            3,
            now,
            now,
        )

    def effect(self, session: Any, input: Any) -> None:
        self.done.append(input)


@pytest.fixture
def consumers(tmp_path: Path) -> Iterator[Consumers]:
    module = load_example("consuming")
    engine = create_engine(f"sqlite:///{tmp_path / 'consumer.sqlite3'}")
    inbox.metadata.create_all(engine)
    yield Consumers(module, sessionmaker(engine), [])
    engine.dispose()


def test_every_consumer_processes_a_message_once() -> None:
    """The tests below deliver one message twice to each consumer of examples/consuming.py, in the
    wire format of the bundled publisher (the key is where the docs say each broker carries it),
    and see its effect run once. This test checks that each consumer has its test."""
    consumers = {
        name
        for name in dir(load_example("consuming"))
        if name.startswith(("consume_", "rabbitmq_", "receive_", "register_"))
    }
    tested = {name for name in globals() if name.startswith("test_consumer_")}
    assert len(tested) == len(consumers) == 7, (sorted(consumers), sorted(tested))


def test_consumer_stdout(consumers: Consumers) -> None:
    from sqla_outbox.publishers.stdout import StdoutPublisher  # noqa: PLC0415

    sent = consumers.message("stdout")
    stream = io.StringIO()
    printer = StdoutPublisher(stream=stream)
    printer.publish(sent)
    printer.publish(sent)
    lines = stream.getvalue().splitlines()
    assert consumers.module.consume_lines(lines, consumers.sessions, consumers.effect) == 1
    assert consumers.done == [sent.input]


def test_consumer_redis(consumers: Consumers) -> None:
    from sqla_outbox.publishers.redis_streams import entry_fields  # noqa: PLC0415

    fields = entry_fields(consumers.message("redis"))
    client = _FakeRedis([("1-0", fields), ("2-0", fields)])
    assert consumers.module.consume_redis(client, consumers.sessions, consumers.effect) == 1
    assert client.acked == ["1-0", "2-0"]
    assert consumers.done == [{"order_id": 42}]


def test_consumer_rabbitmq(consumers: Consumers) -> None:
    pytest.importorskip("pika")
    from sqla_outbox.publishers import rabbitmq  # noqa: PLC0415

    sent = consumers.message("rabbitmq")
    properties = rabbitmq._properties(sent)
    assert properties.headers["idempotency_key"] == sent.idempotency_key
    channel = SimpleNamespace(acks=[])
    channel.basic_ack = channel.acks.append
    on_message = consumers.module.rabbitmq_callback(consumers.sessions, consumers.effect)
    for tag in (1, 2):
        on_message(channel, SimpleNamespace(delivery_tag=tag), properties, rabbitmq._body(sent))
    assert channel.acks == [1, 2]
    assert consumers.done == [sent.input]


def test_consumer_nats(consumers: Consumers) -> None:
    from sqla_outbox.message import compact_json  # noqa: PLC0415
    from sqla_outbox.publishers.nats_jetstream import message_headers  # noqa: PLC0415

    sent = consumers.message("nats")
    acked: list[bool] = []
    copy = _FakeNatsMessage(message_headers(sent), compact_json(sent.input).encode(), acked)
    consume = consumers.module.consume_nats(
        _FakeJetStream([copy, copy]), consumers.sessions, consumers.effect
    )
    assert asyncio.run(consume) == 1
    assert acked == [True, True]
    assert consumers.done == [sent.input]


def test_consumer_kafka(consumers: Consumers) -> None:
    from sqla_outbox.message import compact_json  # noqa: PLC0415
    from sqla_outbox.publishers.kafka import record_headers  # noqa: PLC0415

    sent = consumers.message("kafka")
    record = _FakeKafkaRecord(record_headers(sent), compact_json(sent.input).encode())
    kafka_consumer = _FakeKafkaConsumer([record, record])
    for _ in range(2):
        assert consumers.module.consume_kafka(kafka_consumer, consumers.sessions, consumers.effect)
    assert kafka_consumer.committed == [record, record]
    assert consumers.done == [sent.input]


def test_consumer_webhook(consumers: Consumers) -> None:
    """The real publisher POSTs the message, signed, to the example's endpoint, twice."""
    pytest.importorskip("httpx")
    from sqla_outbox.publishers.http_webhook import WebhookPublisher  # noqa: PLC0415

    secret = b"docs-secret"
    statuses: list[int] = []

    def receive(headers: Any, body: bytes) -> int:
        status = consumers.module.receive_webhook(
            secret, headers, body, consumers.sessions, consumers.effect
        )
        statuses.append(status)
        return int(status)

    sent = consumers.message("webhook")
    server, url = _serve_webhook(receive)
    try:
        with WebhookPublisher(url, hmac_secret=secret, timeout=5) as poster:
            poster.publish(sent)
            poster.publish(sent)
    finally:
        server.shutdown()
        server.server_close()
    assert statuses == [200, 200]
    assert consumers.done == [sent.input]
    forged = {"X-Outbox-Timestamp": "0", "X-Outbox-Signature": "sha256=0", "Idempotency-Key": "x"}
    receive_webhook = consumers.module.receive_webhook
    assert receive_webhook(secret, forged, b"{}", consumers.sessions, consumers.effect) == 401


def test_consumer_celery(consumers: Consumers) -> None:
    """The task the publisher sends, run by the worker's task the way Celery runs it."""
    pytest.importorskip("celery")
    from celery import Celery  # noqa: PLC0415

    from sqla_outbox.publishers.celery_tasks import CeleryPublisher  # noqa: PLC0415

    app = Celery("docs", broker="memory://")
    task = consumers.module.register_tasks(app, consumers.sessions, consumers.effect)
    sends: list[dict[str, Any]] = []
    app.send_task = lambda name, **options: sends.append({"name": name, **options})  # type: ignore[method-assign]
    sent = consumers.message("celery")
    with contextlib.closing(CeleryPublisher(app)) as publisher:
        publisher.publish(sent)
        publisher.publish(sent)
    assert [send["name"] for send in sends] == [task.name, task.name]
    assert sends[0]["task_id"] == sends[0]["headers"]["idempotency_key"] == sent.idempotency_key
    runs = [
        task.apply(args=send["args"], kwargs=send["kwargs"], task_id=send["task_id"]).get()
        for send in sends
    ]
    assert runs == [True, False]
    assert consumers.done == [sent.input]


# -- the site as a whole --------------------------------------------------------------------------


def test_nav_and_pages_agree() -> None:
    """Every page is in mkdocs.yml's nav, and every nav entry is a page."""
    config = (REPO / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:") :]
    listed = [match.group("page") for match in _NAV_PAGE.finditer(nav)]
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"
    on_disk = {path.relative_to(DOCS).as_posix() for path in pages()}
    assert set(listed) == on_disk, (
        f"not in the nav: {sorted(on_disk - set(listed))}; in the nav, missing: "
        f"{sorted(set(listed) - on_disk)}"
    )


def test_reference_identifiers_import() -> None:
    """Every ``::: identifier`` of the API reference names something that imports."""
    for path in pages():
        for identifier in re.findall(r"^:::\s*([\w.]+)", path.read_text(), re.MULTILINE):
            parts = identifier.split(".")
            for split in range(len(parts), 0, -1):
                try:
                    target: Any = importlib.import_module(".".join(parts[:split]))
                except ModuleNotFoundError:
                    continue
                for attribute in parts[split:]:
                    target = getattr(target, attribute)
                break
            else:
                pytest.fail(f"docs/{path.relative_to(DOCS)}: ::: {identifier} does not import")


@pytest.mark.parametrize("path", pages(), ids=lambda path: str(path.relative_to(REPO)))
def test_pages_speak_of_the_product_not_its_history(path: Path) -> None:
    found = [match.group(0) for match in HISTORY.finditer(path.read_text(encoding="utf-8"))]
    assert not found, f"{path.relative_to(REPO)} speaks of the work's history: {found}"


def test_the_history_check_is_real() -> None:
    for said in ("as this session found", "the eleventh session", "see issue #3", "issue 11"):
        assert HISTORY.search(said), said
    for said in ("the session's transaction", "a session joined to it", "Session(engine)"):
        assert not HISTORY.search(said), said
