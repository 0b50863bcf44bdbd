#!/usr/bin/env python3
"""Write docs/reference/COMMAND.md for every trainio command, from the parsers themselves.

The compiled commands (record, replay, datagen, sweep, datasize) are read from their clap
help (`trainio COMMAND --help`), and the value ranges their parsers enforce are asked of the
parsers: each option that takes a value is given 0, -1, a huge number and a word, together
with nothing else, so the parser answers with what it refuses and never runs the command
(a required option is always left missing). The analysis commands (analyze, report,
compare, export, import, slice) are read from their argparse parser (trainio_analysis.__main__).

Hand-written examples and notes live in scripts/reference/COMMAND.md and are appended as
they are. Usage: scripts/gen-reference.py [--out DIR] (default docs/reference), or
`make reference`. Needs a built checkout (`make build`) for the compiled commands.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINIO = ROOT / "bin" / "trainio"
HAND = ROOT / "scripts" / "reference"
COMPILED = ("record", "replay", "datagen", "sweep", "datasize")
ANALYSIS = ("analyze", "report", "compare", "export", "import", "slice")
COMMANDS = (
    "record",
    "analyze",
    "report",
    "compare",
    "export",
    "import",
    "slice",
    "replay",
    "datagen",
    "sweep",
    "datasize",
)
U64_MAX = str(2**64 - 1)
# Help that starts with a tool's name keeps its case ("dftracer trace(s)", not "Dftracer").
KEEP_CASE = ("dftracer", "blkparse", "fio ", "trainio ")


@dataclass
class Arg:
    """One option or positional argument, as the page shows it."""

    spec: str  # e.g. "-o, --output <DIR>" or "TRACE"
    help: str
    longs: list[str] = field(default_factory=list)
    default: str | None = None
    values: str | None = None  # possible values, or the range the parser accepts
    required: bool = False
    repeatable: bool = False


@dataclass
class Command:
    name: str
    about: str
    usage: str
    arguments: list[Arg]
    options: list[Arg]
    epilog: str = ""


# ---------------------------------------------------------------- clap (compiled commands)


def _run(args: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    return subprocess.run(
        [str(TRAINIO), *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd, check=False
    )


_ENTRY = re.compile(r"^ {2,6}(?=[-\[<A-Za-z])")


def _clap_sections(text: str) -> tuple[str, dict[str, list[str]], str]:
    """About (the text before Usage:), the lines of each section, and what follows them."""
    about, _, rest = text.partition("Usage:")
    sections: dict[str, list[str]] = {}
    epilog: list[str] = []
    current: list[str] | None = None
    for line in ("Usage:" + rest).splitlines():
        m = re.match(r"^([A-Z][A-Za-z ]*):(.*)$", line)
        if m and not line.startswith(" "):
            if m.group(1) in ("Arguments", "Options", "Usage"):
                current = sections.setdefault(m.group(1), [])
                if m.group(2).strip():
                    current.append(m.group(2).strip())
                continue
            current = None
        if current is None:
            epilog.append(line)
        elif line.strip() or current:
            current.append(line)
    return about.strip(), sections, "\n".join(epilog).strip()


def _clap_entries(lines: list[str]) -> list[tuple[str, str]]:
    """(spec, help) of each entry; an entry's help is on its line after 2+ spaces (short
    layout) or on the lines indented under it (long layout, paragraphs kept)."""
    entries: list[tuple[str, list[str]]] = []
    for line in lines:
        if _ENTRY.match(line) and len(line) - len(line.lstrip()) <= 6:
            spec, _, help_ = line.strip().partition("  ")
            entries.append((spec.strip(), [help_.strip()] if help_.strip() else []))
        elif entries:
            entries[-1][1].append(line.strip())
    out = []
    for spec, help_lines in entries:
        paras = "\n".join(help_lines).strip().split("\n\n")
        out.append((spec, "\n\n".join(" ".join(p.split()) for p in paras if p.strip())))
    return out


_DEFAULT = re.compile(r"\s*\[default: ([^\]]*)\]")
_POSSIBLE = re.compile(r"\s*\[possible values: ([^\]]*)\]")


def _range_words(r: str) -> str:
    """clap's range as words: 1..=1000 -> 1 to 1000; 1..18446744073709551615 -> at least 1."""
    lo, inclusive, hi = re.match(r"(-?\d+)\.\.(=?)(-?\d*)", r).groups()
    if not hi or (not inclusive and hi == U64_MAX):
        return f"at least {int(lo):,}"
    return f"{int(lo):,} to {int(hi) if inclusive else int(hi) - 1:,}"


def _probe(cmd: str, long: str, required: list[str]) -> str | None:
    """What the parser of `trainio cmd` accepts for `long`, asked with values it may refuse.
    Only called while another required option is missing, so the command never runs."""
    if not [r for r in required if r != long]:
        return None
    kinds, ranges, refusals = set(), [], []
    with tempfile.TemporaryDirectory() as cwd:
        for value in ("x", "0", "-1", U64_MAX):
            err = _run([cmd, f"{long}={value}"], cwd=cwd).stderr
            m = re.search(r"invalid value '[^']*' for '[^']*': (.*)", err)
            if not m:
                continue
            why = m.group(1).strip()
            if "invalid digit" in why or "number too large" in why:
                kinds.add("an integer")
            elif "invalid float" in why:
                kinds.add("a number")
            elif r := re.search(r"is not in (\S+)", why):
                ranges.append(_range_words(r.group(1)))
            elif r := re.search(r"`[^`]*` is not (.*)", why):
                kinds.add(r.group(1))
            else:
                refusals.append(f"`{value}` is refused: {why}")
    if ranges:
        return f"an integer, {ranges[0]}"
    if refusals:
        return "; ".join(refusals)
    return max(sorted(kinds), key=len) if kinds else None


def clap_command(name: str) -> Command:
    r = _run([name, "--help"])
    if r.returncode != 0:
        sys.exit(f"gen-reference: trainio {name} --help failed (run 'make build' first): {r.stderr.strip()}")
    about, sections, epilog = _clap_sections(r.stdout)
    usage = " ".join(sections.get("Usage", [""])).strip()
    required = re.findall(r"(--[\w-]+) <", usage.split("[OPTIONS]", 1)[-1].split("[", 1)[0])
    arguments, options = [], []
    for spec, help_ in _clap_entries(sections.get("Arguments", [])):
        arguments.append(Arg(spec=spec, help=help_, repeatable="..." in spec, required=not spec.startswith("[")))
    for spec, help_ in _clap_entries(sections.get("Options", [])):
        a = Arg(spec=spec, help=help_, longs=re.findall(r"--[\w-]+", spec.split("<")[0]))
        if m := _DEFAULT.search(a.help):
            a.default = m.group(1)
        if m := _POSSIBLE.search(a.help):
            a.values = "one of " + ", ".join(f"`{v.strip()}`" for v in m.group(1).split(","))
        a.help = _POSSIBLE.sub("", _DEFAULT.sub("", a.help)).strip()
        a.required = bool(a.longs) and a.longs[0] in required
        a.repeatable = "repeatable" in a.help
        if a.values is None and "<" in spec and a.longs:
            a.values = _probe(name, a.longs[0], required)
        options.append(a)
    return Command(name, about, usage, arguments, options, epilog)


# ---------------------------------------------------------------- argparse (analysis commands)


def _type_words(action: argparse.Action) -> str | None:
    t = action.type
    if t is int:
        return "an integer"
    if t is float:
        return "a number"
    if callable(t):
        for value in ("0", "-1", "x"):
            try:
                t(value)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                if value == "0":
                    return re.sub(r"^(must be )", "", str(exc).replace("'0': ", ""))
    return None


def argparse_commands() -> dict[str, Command]:
    sys.path.insert(0, str(ROOT / "analysis"))
    os.environ["COLUMNS"] = "100"
    from trainio_analysis.__main__ import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    abouts = {c.dest: c.help or "" for c in sub._choices_actions}
    out = {}
    for name, p in sub.choices.items():
        usage = " ".join(p.format_usage().split()).removeprefix("Usage: ")
        arguments, options = [], []
        for a in p._actions:
            if a.option_strings:
                metavar = a.metavar or (a.dest.upper() if a.nargs != 0 else None)
                spec = ", ".join(a.option_strings) + (f" <{metavar}>" if metavar else "")
                if a.nargs == "+":
                    spec += "..."
                arg = Arg(spec=spec, help=a.help or "", longs=[s for s in a.option_strings if s.startswith("--")])
                arg.required = a.required
                if isinstance(a, argparse._AppendAction):
                    arg.repeatable = True
                if a.default not in (None, False, argparse.SUPPRESS) and a.nargs != 0:
                    arg.default = str(a.default)
                if a.choices:
                    arg.values = "one of " + ", ".join(f"`{c}`" for c in a.choices)
                else:
                    arg.values = _type_words(a)
                options.append(arg)
            else:
                spec = a.dest.upper() + ("..." if a.nargs == "+" else "")
                arguments.append(Arg(spec=spec, help=a.help or "", required=True, repeatable=a.nargs == "+"))
        groups = [g for g in p._mutually_exclusive_groups if g.required]
        epilog = ""
        for g in groups:
            names = " or ".join(f"`{x.option_strings[-1]}`" for x in g._group_actions)
            epilog += f"Exactly one of {names} is required.\n"
        out[name] = Command(name, _sentence(abouts[name]), usage, arguments, options, epilog)
    return out


# ---------------------------------------------------------------- the page


def _sentence(text: str) -> str:
    """Text as a sentence: capitalized, ending in a full stop."""
    text = text.strip()
    if not text:
        return text
    if not text.startswith(KEEP_CASE):
        text = text[:1].upper() + text[1:]
    return text + ("" if text[-1] in ".:!?" else ".")


def _sections(text: str) -> dict[str, str]:
    """A hand-written file's `## Heading` sections, in order (text before any heading: "")."""
    out: dict[str, str] = {}
    head = ""
    for line in text.splitlines():
        if line.startswith("## "):
            head = line[3:].strip()
            out.setdefault(head, "")
        else:
            out[head] = out.get(head, "") + line + "\n"
    return {k: v.strip() for k, v in out.items() if v.strip() or k}


def render(c: Command) -> str:
    hand = HAND / f"{c.name}.md"
    lines = [
        f"<!-- Generated by scripts/gen-reference.py (`make reference`) from the parser of `trainio {c.name}`;",
        f"     edit the program's help, or the examples and notes in scripts/reference/{c.name}.md. -->",
        f"# trainio {c.name}",
        "",
        _sentence(c.about),
        "",
        "```",
        c.usage,
        "```",
        "",
    ]
    if c.arguments:
        lines += ["## Arguments", ""]
        for a in c.arguments:
            lines.append(f"- `{a.spec}`: {_sentence(a.help)}")
        lines.append("")
    lines += ["## Options", ""]
    for a in c.options:
        lines += [f"### `{a.spec}`", ""]
        help_ = _sentence(a.help) or "(no help text)"
        lines += [help_, ""]
        facts = []
        if a.required:
            facts.append("Required.")
        if a.default is not None:
            facts.append(f"Default: `{a.default}`.")
        if a.values:
            facts.append(f"Value: {a.values}.")
        if a.repeatable and "repeatable" not in a.help:
            facts.append("Repeatable.")
        if facts:
            lines += [" ".join(facts), ""]
    helped = [e.removeprefix("Example:").strip() for e in c.epilog.splitlines() if e.startswith("Example:")]
    rest = "\n".join(e for e in c.epilog.splitlines() if not e.startswith("Example:")).strip()
    if rest:
        lines += [rest, ""]
    sections = _sections(hand.read_text()) if hand.exists() else {}
    if "" in sections:
        sys.exit(f"gen-reference: {hand} has text before its first '## ' heading")
    if helped or "Examples" in sections:
        lines += ["## Examples", ""]
        if helped:
            lines += ["```sh", *helped, "```", ""]
        if "Examples" in sections:
            lines += [sections.pop("Examples"), ""]
    for head, body in sections.items():
        lines += [f"## {head}", "", body, ""]
    return "\n".join(lines).rstrip() + "\n"


def index(commands: dict[str, Command]) -> str:
    lines = [
        "<!-- Generated by scripts/gen-reference.py (`make reference`). -->",
        "# Command reference",
        "",
        "One page per command, generated from the command's own parser: every option with its help,",
        "default and accepted values. What `-o` and `--json` mean in each command: [cli.md](../cli.md).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for name in COMMANDS:
        lines.append(f"| [`trainio {name}`]({name}.md) | {_sentence(commands[name].about.splitlines()[0])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description="Write docs/reference/COMMAND.md for every trainio command.")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "reference", help="directory to write")
    out = ap.parse_args().out
    commands = {**argparse_commands(), **{name: clap_command(name) for name in COMPILED}}
    missing = set(COMMANDS) - set(commands)
    if missing:
        sys.exit(f"gen-reference: no parser for {sorted(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        (out / f"{name}.md").write_text(render(commands[name]))
    (out / "README.md").write_text(index(commands))
    print(f"gen-reference: wrote {len(COMMANDS)} pages and README.md in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
