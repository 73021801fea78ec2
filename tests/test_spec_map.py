"""PROTOCOL.md and the code point at each other, and both ends of every pointer exist.

Static, like ``tests/test_layering.py``: files are parsed, not imported (except ``segment_format.protocol``
for its ``FEATURES`` dict). Three checks, each also run on small synthetic inputs so that a broken checker
cannot pass silently:

1. **Appendix A names every module.** Every ``*.py`` file of the three packages except ``__init__.py``
   appears in Appendix A of PROTOCOL.md as a backticked path relative to the repository root, exactly
   (``segment_format/log/chain.py``); and every backticked ``.py`` path there exists. The module list is
   computed from the file tree when the test runs, so it checks whatever layout the tree has.
2. **Every citation of PROTOCOL.md in the code resolves.** Every occurrence of ``PROTOCOL.md`` in a ``.py``
   file of the three packages (comments, docstrings and strings alike) is either a citation of this grammar,
   or names the document as a whole (``PROTOCOL.md's feature table``, ``the protocol of PROTOCOL.md``)::

       citation  := "PROTOCOL.md" SEP ref ( "," SEP ref )*
       ref       := section [ "-" section ]                   a section, or a range of sections
                    [ ", assumption A" DIGITS ]               only after section 2: an assumption it defines
                    [ ", I" DIGITS ]                          only after section 13: an invariant it states
                    [ ", *" NAME "*" ]                        a paragraph of that section, by its lead-in
       section   := DIGITS [ "." DIGITS ]
       SEP       := spaces, or a line break with the next line's indentation and comment marker (# or #:)

   ``N`` resolves to a heading ``## N. ...``, ``N.M`` to ``### N.M ...``; ``2, assumption A4`` to section 2
   defining ``**A4 — ...**``; ``13, I11`` to section 13 stating ``**I11. ...**``; ``11.2, *Timeouts*`` to
   section 11.2 holding a lead-in ``**Timeouts.**`` or ``*Timeouts.*``. Prose may follow a citation
   (``PROTOCOL.md 7.2 step 3``). What is refused: a reference that does not resolve, and a malformed one
   that the grammar does not take but that looks like a reference (``PROTOCOL.md A4``,
   ``PROTOCOL.md, "Topics"``, ``PROTOCOL.md section 5``, ``PROTOCOL.md 8, A4``), which would otherwise
   escape the check.
3. **The features table of 12.2 is** ``FEATURES``: one row per feature, with its kind (``reader-writer``
   when ``reader`` is set, else ``writer``) and its section, in one contiguous markdown table (a blank line
   ends a markdown table, so a row after one is not part of it).

PROTOCOL.md itself cites its assumptions as ``assumption A4`` (never a bare ``A4``, which reads like
Appendix A): checked too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "PROTOCOL.md"
PACKAGES = ("segment_format", "coordinator", "pyspark_logsource")

_HEADING = re.compile(r"^(?P<hashes>##|###) (?P<number>\d+(?:\.\d+)?)\.? (?P<title>.+)$", re.M)
_APPENDIX_A = re.compile(r"^## Appendix A\b.*$", re.M)
_SECTION = r"\d+(?:\.\d+)?"
#: Between "PROTOCOL.md" and its reference: spaces, or a line break, indentation and a comment marker.
_SEP = r"(?:[ \t]+|[ \t]*\n[ \t]*(?:#:?[ \t]+)?)"
_REF = re.compile(
    rf"(?P<section>{_SECTION})(?:-(?P<to>{_SECTION}))?"
    r"(?:, assumption A(?P<assumption>\d+))?(?:, I(?P<invariant>\d+))?(?:, \*(?P<name>[^*]{1,80})\*)?"
)
#: What follows a parsed citation (or a bare "PROTOCOL.md") and means a reference the grammar did not take.
_LOOKS_LIKE_A_REFERENCE = re.compile(rf"^(?:,\s*|{_SEP})?(?:[\d\"*§]|A\d|I\d|assumption|sections?\b)")


@dataclass
class Spec:
    """What the checks need of PROTOCOL.md: section bodies by number, and Appendix A's text."""

    sections: dict[str, str] = field(default_factory=dict)
    appendix_a: str = ""

    @classmethod
    def parse(cls, text: str) -> Spec:
        """Split ``text`` at its numbered headings; a ``##`` section's body includes its subsections."""
        spec = cls()
        appendix = _APPENDIX_A.search(text)
        body_end = appendix.start() if appendix else len(text)
        spec.appendix_a = text[appendix.end() :] if appendix else ""
        heads = list(_HEADING.finditer(text[:body_end]))
        for i, head in enumerate(heads):
            level = len(head["hashes"])
            end = next((h.start() for h in heads[i + 1 :] if len(h["hashes"]) <= level), body_end)
            spec.sections[head["number"]] = text[head.end() : end]
        return spec

    def assumptions(self) -> set[str]:
        """The assumptions section 2 defines (``**A4 — ...**``)."""
        return set(re.findall(r"\*\*A(\d+) —", self.sections.get("2", "")))

    def invariants(self) -> set[str]:
        """The invariants section 13 states (``**I11. ...**``)."""
        return set(re.findall(r"\*\*I(\d+)\.", self.sections.get("13", "")))


@dataclass(frozen=True)
class Problem:
    """One finding: where, and what is wrong."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


# ---- check 1: modules in Appendix A -------------------------------------------------------------------------


def module_files(root: Path, packages: Iterable[str] = PACKAGES) -> list[str]:
    """Every module of ``packages`` under ``root``, as a path relative to ``root`` (``__init__.py`` excluded)."""
    return sorted(
        path.relative_to(root).as_posix()
        for package in packages
        for path in (root / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def backticked(text: str) -> set[str]:
    """Every backticked span of ``text``."""
    return set(re.findall(r"`([^`\n]+)`", text))


def missing_modules(spec: Spec, modules: Iterable[str]) -> list[Problem]:
    """Modules that Appendix A does not name as a backticked path."""
    named = backticked(spec.appendix_a)
    return [Problem(module, "not named in PROTOCOL.md Appendix A") for module in modules if module not in named]


def stale_paths(spec: Spec, root: Path, packages: Iterable[str] = PACKAGES) -> list[Problem]:
    """Backticked ``.py`` paths of Appendix A, inside the packages or ``tests/``, that do not exist under ``root``."""
    prefixes = tuple(f"{p}/" for p in (*packages, "tests"))
    return [
        Problem(path, "named in PROTOCOL.md Appendix A but no such file")
        for path in sorted(backticked(spec.appendix_a))
        if path.endswith(".py") and path.startswith(prefixes) and not (root / path).is_file()
    ]


# ---- check 2: citations of PROTOCOL.md in the code ----------------------------------------------------------


def _resolve(spec: Spec, ref: re.Match[str]) -> str | None:
    """Why ``ref`` does not resolve, or None when it does."""
    section, to = ref["section"], ref["to"]
    for number in (section, to):
        if number is not None and number not in spec.sections:
            return f"no section {number}"
    if ref["assumption"] is not None:
        if section != "2" or to is not None:
            return "an assumption is cited as '2, assumption A<n>'"
        if ref["assumption"] not in spec.assumptions():
            return f"section 2 defines no assumption A{ref['assumption']}"
    if ref["invariant"] is not None:
        if section != "13" or to is not None:
            return "an invariant is cited as '13, I<n>'"
        if ref["invariant"] not in spec.invariants():
            return f"section 13 states no invariant I{ref['invariant']}"
    if ref["name"] is not None:
        # A lead-in wraps across lines in both files: compare with line breaks (and comment markers) as spaces.
        name = " ".join(re.sub(r"\n\s*#:?", " ", ref["name"]).split())
        if f"*{name}" not in " ".join(spec.sections[to or section].split()):
            return f"section {to or section} has no paragraph *{name}*"
    return None


def citation_problems(spec: Spec, text: str, where: str) -> list[Problem]:
    """Every citation of PROTOCOL.md in ``text`` that is malformed or does not resolve (grammar: module doc)."""
    problems: list[Problem] = []
    for mention in re.finditer(r"PROTOCOL\.md(?!')", text):
        line = text.count("\n", 0, mention.start()) + 1
        at = f"{where}:{line}"
        pos = mention.end()
        sep = re.compile(_SEP).match(text, pos)
        ref = _REF.match(text, sep.end()) if sep else None
        if ref is None:
            # Not a citation: the document named as a whole, unless what follows looks like a reference.
            if _LOOKS_LIKE_A_REFERENCE.match(text[pos : pos + 40]):
                problems.append(Problem(at, f"malformed citation {text[mention.start() : pos + 30]!r}"))
            continue
        while ref is not None:
            why = _resolve(spec, ref)
            if why is not None:
                problems.append(Problem(at, f"PROTOCOL.md {ref.group(0)!r} does not resolve: {why}"))
            pos = ref.end()
            comma = re.compile(rf",{_SEP}").match(text, pos)
            ref = _REF.match(text, comma.end()) if comma else None
        if _LOOKS_LIKE_A_REFERENCE.match(text[pos : pos + 40]):
            problems.append(Problem(at, f"malformed citation {text[mention.start() : pos + 30]!r}"))
    return problems


def code_citation_problems(spec: Spec, root: Path, packages: Iterable[str] = PACKAGES) -> list[Problem]:
    """:func:`citation_problems` over every ``.py`` file of ``packages``."""
    problems: list[Problem] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            problems += citation_problems(spec, path.read_text(encoding="utf-8"), rel)
    return problems


def bare_assumption_problems(text: str) -> list[Problem]:
    """Mentions of an assumption in PROTOCOL.md as a bare ``A<n>`` rather than ``assumption A<n>``."""
    problems = []
    for m in re.finditer(r"(?<![\w*])A(\d)\b", text):
        before = text[max(0, m.start() - 20) : m.start()]
        if not re.search(r"assumptions? $|assumptions? A\d, $", before, re.I):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(Problem(f"PROTOCOL.md:{line}", f"bare {m.group(0)}: write 'assumption {m.group(0)}'"))
    return problems


# ---- check 3: the features table of 12.2 --------------------------------------------------------------------

_TABLE_HEADER = "| feature | kind | section | meaning |"


def feature_rows(spec: Spec) -> tuple[dict[str, tuple[str, str]], list[Problem]]:
    """The rows of 12.2's features table (name -> (kind, section)), and rows cut off from it."""
    body = spec.sections.get("12.2", "")
    lines = body.split("\n")
    if _TABLE_HEADER not in lines:
        return {}, [Problem("PROTOCOL.md 12.2", "no features table")]
    start = lines.index(_TABLE_HEADER) + 2  # past the header and its |---| line
    rows: dict[str, tuple[str, str]] = {}
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        cells = [c.strip() for c in lines[end].strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = (cells[1], cells[2])
        end += 1
    problems = [
        Problem("PROTOCOL.md 12.2", f"table row outside the contiguous table: {line!r}")
        for line in lines[end:]
        if line.startswith("| `")
    ]
    return rows, problems


def feature_problems(spec: Spec, features: Mapping[str, tuple[bool, str]]) -> list[Problem]:
    """Differences between 12.2's table and ``features`` (name -> (reader, section))."""
    rows, problems = feature_rows(spec)
    want = {name: ("reader-writer" if reader else "writer", section) for name, (reader, section) in features.items()}
    for name in sorted(rows.keys() | want.keys()):
        if rows.get(name) != want.get(name):
            what = f"feature {name}: table {rows.get(name)}, code {want.get(name)}"
            problems.append(Problem("PROTOCOL.md 12.2", what))
        elif want[name][1] not in spec.sections:
            problems.append(Problem("PROTOCOL.md 12.2", f"feature {name}: no section {want[name][1]}"))
    return problems


# ---- the checks on the repository ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec() -> Spec:
    """PROTOCOL.md, parsed."""
    return Spec.parse(SPEC.read_text(encoding="utf-8"))


def test_appendix_a_names_every_module(spec: Spec) -> None:
    """Check 1: every module file is a backticked path of Appendix A."""
    problems = missing_modules(spec, module_files(ROOT))
    assert not problems, "\n".join(map(str, problems))


def test_appendix_a_names_only_existing_modules(spec: Spec) -> None:
    """Check 1, the other way: Appendix A names no module that is gone."""
    problems = stale_paths(spec, ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_every_citation_in_the_code_resolves(spec: Spec) -> None:
    """Check 2: every ``PROTOCOL.md <ref>`` in the packages points at a section that exists."""
    problems = code_citation_problems(spec, ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_protocol_md_cites_assumptions_unambiguously() -> None:
    """PROTOCOL.md writes ``assumption A4``, never a bare ``A4`` that reads like Appendix A."""
    problems = bare_assumption_problems(SPEC.read_text(encoding="utf-8"))
    assert not problems, "\n".join(map(str, problems))


def test_features_table_is_the_codes_feature_list(spec: Spec) -> None:
    """Check 3: 12.2's table equals ``FEATURES`` of ``segment_format/protocol.py``."""
    from segment_format.protocol import FEATURES

    problems = feature_problems(spec, {name: (f.reader, f.section) for name, f in FEATURES.items()})
    assert not problems, "\n".join(map(str, problems))
    assert all(name == f.name for name, f in FEATURES.items())


# ---- the checker on synthetic inputs --------------------------------------------------------------------------

_TINY_SPEC = """# Tiny

## 2. Storage

* **A1 — atomic create.** Creates are atomic.

**Retries and lost answers.** Retry.

## 9. Reading

**Planned reads.** Plans.

### 9.1 Change notices

Notices.

## 12. Versions

### 12.2 Features

| feature | kind | section | meaning |
|---|---|---|---|
| `changeNotices` | writer | 9.1 | notices |
| `compaction` | reader-writer | 9 | gaps |

## 13. Why

**I5. No resurrection.** Because.

## Appendix A. Map

| term | code |
|---|---|
| reading (9) | `pkg/reader.py`, `pkg/sub/chain.py` |
"""


def _tree(tmp_path: Path, files: Iterable[str], text: str = "") -> Path:
    for name in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_checker_finds_a_missing_module_and_a_stale_one(tmp_path: Path) -> None:
    """A module the appendix does not name is reported; ``__init__.py`` is not; a named file that is gone is."""
    spec = Spec.parse(_TINY_SPEC)
    root = _tree(tmp_path, ["pkg/__init__.py", "pkg/reader.py", "pkg/writer.py", "pkg/sub/__init__.py"])
    assert module_files(root, ["pkg"]) == ["pkg/reader.py", "pkg/writer.py"]
    assert [p.where for p in missing_modules(spec, module_files(root, ["pkg"]))] == ["pkg/writer.py"]
    assert [p.where for p in stale_paths(spec, root, ["pkg"])] == ["pkg/sub/chain.py"]
    _tree(tmp_path, ["pkg/sub/chain.py"])
    assert stale_paths(spec, root, ["pkg"]) == []


def test_checker_passes_every_citation_form_of_the_grammar() -> None:
    """Each form of the grammar, wrapped across comment lines too, resolves against a spec that has it."""
    spec = Spec.parse(_TINY_SPEC)
    good = (
        "see PROTOCOL.md 9.1.\n"
        "(PROTOCOL.md 9, *Planned reads*)\n"
        "(PROTOCOL.md 2, assumption A1)\n"
        "(PROTOCOL.md 9, 2, assumption A1; and more)\n"
        "(PROTOCOL.md 13, I5)\n"
        "(PROTOCOL.md 9-12)\n"
        "(PROTOCOL.md 2, *Retries and lost answers*)\n"
        "# a lead-in wrapped (PROTOCOL.md 2, *Retries and\n# lost answers*)\n"
        "x = 1  # a comment that wraps (PROTOCOL.md\n    # 9.1 step 3)\n"
        "#: a doc comment (PROTOCOL.md\n#: 12.2)\n"
        "PROTOCOL.md's table, the protocol of PROTOCOL.md, as bytes; PROTOCOL.md specifies it.\n"
    )
    assert citation_problems(spec, good, "good.py") == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("(PROTOCOL.md 11.8)", "no section 11.8"),
        ("(PROTOCOL.md 9.2)", "no section 9.2"),
        ("(PROTOCOL.md 9-14)", "no section 14"),
        ("(PROTOCOL.md 2, assumption A4)", "defines no assumption A4"),
        ("(PROTOCOL.md 9, assumption A1)", "'2, assumption A<n>'"),
        ("(PROTOCOL.md 13, I6)", "states no invariant I6"),
        ("(PROTOCOL.md 9, *Timeouts*)", "no paragraph *Timeouts*"),
        ("(PROTOCOL.md A1)", "malformed"),
        ("(PROTOCOL.md, A1)", "malformed"),
        ('(PROTOCOL.md, "Reading")', "malformed"),
        ("(PROTOCOL.md section 9)", "malformed"),
        ("(PROTOCOL.md 9, A1)", "malformed"),
        ("x  # (PROTOCOL.md\n  # 9.3)", "no section 9.3"),
    ],
)
def test_checker_finds_a_dangling_or_malformed_citation(text: str, why: str) -> None:
    """Each broken citation is reported, naming the file and line."""
    problems = citation_problems(Spec.parse(_TINY_SPEC), "first line\n" + text, "bad.py")
    assert len(problems) == 1, problems
    assert why in problems[0].what and problems[0].where == "bad.py:2"


def test_checker_finds_a_feature_table_mismatch() -> None:
    """A feature missing from the table, a wrong kind or section, and a row cut off by a blank line."""
    spec = Spec.parse(_TINY_SPEC)
    assert feature_problems(spec, {"changeNotices": (False, "9.1"), "compaction": (True, "9")}) == []
    missing = feature_problems(spec, {"changeNotices": (False, "9.1"), "compaction": (True, "9"), "x": (True, "9")})
    assert [p.what for p in missing] == ["feature x: table None, code ('reader-writer', '9')"]
    assert len(feature_problems(spec, {"changeNotices": (True, "9.1"), "compaction": (True, "9")})) == 1
    assert len(feature_problems(spec, {"changeNotices": (False, "9"), "compaction": (True, "9")})) == 1
    cut = Spec.parse(_TINY_SPEC.replace("| `compaction`", "\n| `compaction`"))
    found = [p.what for p in feature_problems(cut, {"changeNotices": (False, "9.1"), "compaction": (True, "9")})]
    assert any("outside the contiguous table" in what for what in found)
    assert any("feature compaction: table None" in what for what in found)


def test_checker_finds_a_bare_assumption() -> None:
    """``A4`` alone is reported; ``assumption A4``, ``assumptions A1, A3`` and a definition are not."""
    text = "* **A4 — bounded.** x\nby assumption A4 and assumptions A1, A3.\nas A4 says\n"
    assert [p.where for p in bare_assumption_problems(text)] == ["PROTOCOL.md:3"]
