"""The reproduction packs audited against the papers' text: every number at its place in its table.

Each pack (``ragate/eval/packs/*.json``) copies one table of a paper. For every row and every non-null number
(the ``paper`` metrics and ``tau``) the audit finds the pack's table in ``../shared/papers/<source>`` by its
caption, reads the table into cells keyed by (model, row label, dataset, field) with the columns worked out
from the table's own header lines, and compares the cell printed there with the pack's value after the
pack's documented conversion (percent -> fraction, fraction -> percent). The pack copies the printed digits,
so the two must agree to a small fraction of the printed number's last digit. The audit also checks the other
way: where the pack holds null, or has no row, the table prints nothing (the pack's "left out" columns
aside), so no printed number goes missing.

The four tables are laid out differently, so each has a small parser (``_parse_*``) turning its lines into
cells; :data:`SPECS` holds what else differs per pack (caption side, conversions, renamed and left-out columns).
"""

from __future__ import annotations

import copy
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ragate.report.reproduce import load_pack, pack_names

PAPERS = Path(__file__).parents[2] / "shared" / "papers"

pytestmark = pytest.mark.skipif(
    not PAPERS.is_dir(), reason=f"the papers' text is not at {PAPERS} (../shared/papers, present in CI)"
)

# A cell's address: (model or None, row label, dataset, field), field a pack metric or "tau".
Key = tuple[str | None, str, str, str]

METRIC = {"EM": "em", "F1": "f1", "Accuracy": "acc"}  # the header's metric names -> the packs'
NUMBER = re.compile(r"\(?([+-]?\d+(?:\.(\d+))?)%?\)?")  # 18.73, 0.146, (87.7%) as printed
SLACK = 1e-3  # of the printed number's last digit: room for the conversion's float noise, not for a new digit
MARKUP = re.compile(r"</?[uib]>|\*|\$|\\(?:up|down)arrow")  # <u>..</u>, <i>..</i>, **bold**, $u = 0.001$


def norm(text: str) -> str:
    """A label or header as read: the PDF's markup dropped, whitespace collapsed."""
    return " ".join(MARKUP.sub("", text).split())


@dataclass(frozen=True)
class Cell:
    text: str  # as printed, e.g. "18.73", "0.146", "(87.7%)"
    line: int  # 1-based line of the paper's text


class Grid(dict[Key, Cell]):
    """A table's cells; a parser setting one address twice is a parser bug, not a paper's."""

    def __setitem__(self, key: Key, cell: Cell) -> None:
        assert key not in self, f"two cells at {key} (lines {self[key].line} and {cell.line})"
        super().__setitem__(key, cell)


# -- the parsers: a table's lines (number, text) -> its cells ----------------------------------------------


def _columns(top: list[str], sub: list[str]) -> list[tuple[str, str]]:
    """(group, metric) per column of a two-line header: a group's name spans the empty cells to its right."""
    group, columns = "", []
    for i in range(max(len(top), len(sub))):
        group = (norm(top[i]) if i < len(top) else "") or group
        columns.append((group, norm(sub[i]) if i < len(sub) else ""))
    return columns


def _parse_dtr(lines: list[tuple[int, str]]) -> Grid:
    """DTR Table 2, tab-separated. Header: ``Method | HotpotQA | | NaturalQA | ... | Average`` over
    ``| EM | F1 | EM | F1 ...``. A model block opens with a lone ``<i>Qwen2.5-7B-Instruct</i>`` line; a method
    line ``DTR ($u = 0.001$) | 36.53 | 46.95 ...`` may be followed by ``Trigger Ratio | (87.7%) | | (94.8%)``,
    one percentage per dataset in the dataset's first column; the threshold u is printed in the label."""
    (_, top), (_, sub), *body = lines
    columns = _columns(top.split("\t"), sub.split("\t"))
    datasets = dict.fromkeys(group for group, metric in columns if metric)
    grid, model, label = Grid(), "", ""
    for no, line in body:
        cells = [norm(c) for c in line.split("\t")]
        if not any(cells[1:]):
            model = cells[0]
        elif cells[0] == "Trigger Ratio":
            for i, text in enumerate(cells[1:], 1):
                if text:
                    grid[model, label, columns[i][0], "retrieval_rate"] = Cell(text, no)
        else:
            label = cells[0]
            for i, text in enumerate(cells[1:], 1):
                group, metric = columns[i]
                grid[model, label, group, METRIC[metric]] = Cell(text, no)
            if u := re.search(r"\(u = ([\d.]+)\)", label):
                for group in datasets:
                    grid[model, label, group, "tau"] = Cell(u[1], no)
    return grid


def _parse_etc(lines: list[tuple[int, str]]) -> Grid:
    """ETC Table 2, tab-separated. Header: ``LLM | RAG Method | 2WikiMultihopQA | | HotpotQA | | StrategyQA |
    IIRC | | Avg.Score`` over ``| | EM | F1 | EM | F1 | Accuracy | EM | F1 |``; the model is printed on its
    block's first row only (``Llama2-7b | w/o RAG | 0.146 ...``, then ``| Single RAG | 0.169 ...``)."""
    (_, top), (_, sub), *body = lines
    columns = _columns(top.split("\t"), sub.split("\t"))
    grid, model = Grid(), ""
    for no, line in body:
        cells = [norm(c) for c in line.split("\t")]
        model, label = cells[0] or model, cells[1]
        for i, text in enumerate(cells[2:], 2):
            group, metric = columns[i]
            grid[model, label, group, METRIC.get(metric, metric)] = Cell(text, no)
    return grid


def _parse_pairs(lines: list[tuple[int, str]]) -> Grid:
    """PAIRS Table 2, space-separated (labels have spaces: a row is its label then its numbers). Header:
    ``MethodHotpotQA 2WikiQA ... Average`` (run together as extracted) over ``EM F1`` per dataset. ``RA ratio
    (74.4%) (69.1%) ...`` under the PAIRS row gives one percentage per dataset."""
    (_, top), (_, sub), *body = lines
    groups = norm(top).removeprefix("Method").split()
    metrics = sub.split()
    span, rest = divmod(len(metrics), len(groups))
    assert rest == 0, f"{len(metrics)} metric headers over {len(groups)} datasets"
    columns = [(g, metrics[i * span + j]) for i, g in enumerate(groups) for j in range(span)]
    grid, label = Grid(), ""
    for no, line in body:
        tokens = norm(line).split()
        first = next(i for i, t in enumerate(tokens) if NUMBER.fullmatch(t))
        name, values = " ".join(tokens[:first]), tokens[first:]
        if name == "RA ratio":
            assert len(values) == len(groups), f"line {no}: {len(values)} ratios, {len(groups)} datasets"
            for group, text in zip(groups, values, strict=True):
                grid[None, label, group, "retrieval_rate"] = Cell(text, no)
        else:
            label = name
            assert len(values) == len(columns), f"line {no}: {len(values)} numbers for {len(columns)} columns"
            for (group, metric), text in zip(columns, values, strict=True):
                grid[None, label, group, METRIC[metric]] = Cell(text, no)
    return grid


def _parse_targ(lines: list[tuple[int, str]]) -> Grid:
    """TARG Table 1, tab-separated, one header line: ``Dataset | Model | τ | EM / F1 (%) | Retrieval Rate |
    Δ Latency (s/q)``. The dataset is printed on its group's first row only; EM and F1 share one cell
    (``60.8 / 61.4``); τ is ``-`` for the baselines."""
    (_, header), *body = lines
    heads = [norm(h) for h in header.split("\t")]
    grid, dataset = Grid(), ""
    for no, line in body:
        cells = [norm(c) for c in line.split("\t")]
        dataset, label = cells[0] or dataset, cells[1]
        for head, text in zip(heads[2:], cells[2:], strict=True):
            if head == "τ":
                if text != "-":
                    grid[None, label, dataset, "tau"] = Cell(text, no)
            elif head == "EM / F1 (%)":
                em, f1 = text.split(" / ")
                grid[None, label, dataset, "em"] = Cell(em, no)
                grid[None, label, dataset, "f1"] = Cell(f1, no)
            elif head == "Retrieval Rate":
                grid[None, label, dataset, "retrieval_rate"] = Cell(text, no)
            else:
                grid[None, label, dataset, head] = Cell(text, no)
    return grid


# -- what differs per pack ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    parse: Callable[[list[tuple[int, str]]], Grid]
    caption_below: bool  # the caption follows the table (True) or precedes it
    # Each difference between the table and the pack, with the phrase of the pack's notes that documents it.
    # scale: field -> (the pack holds printed * this, phrase); renamed: a dataset as printed -> (the pack's
    # name, phrase); left_out: a column (dataset group or field) the pack does not copy -> phrase.
    scale: dict[str, tuple[float, str]] = field(default_factory=dict)
    renamed: dict[str, tuple[str, str]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)


SPECS = {
    "dtr-table2": Spec(
        _parse_dtr,
        caption_below=True,
        scale={"retrieval_rate": (0.01, "printed in percent under the LLM Judge and DTR rows, converted")},
        left_out={"Average": "Left out: the 'Average' column"},
    ),
    "etc-table2": Spec(
        _parse_etc,
        caption_below=True,
        scale={m: (100.0, "they are multiplied by 100 here") for m in ("em", "f1", "acc")},
        left_out={"Avg.Score": "Left out: the 'Avg.Score' column"},
    ),
    "pairs-table2": Spec(
        _parse_pairs,
        caption_below=True,
        scale={"retrieval_rate": (0.01, "(percent, converted to a fraction)")},
        renamed={"SQuAQ": ("SQuAD", "The column printed 'SQuAQ' is SQuAD.")},
        left_out={"Average": "Left out: the 'Average' column"},
    ),
    "targ-table1": Spec(
        _parse_targ,
        caption_below=False,
        left_out={"Δ Latency (s/q)": "Left out: the 'Delta Latency (s/q)' column"},
    ),
}


# -- the audit ---------------------------------------------------------------------------------------------


def table_lines(pack: dict[str, Any], lines: list[str]) -> list[tuple[int, str]]:
    """The pack's table: the block of non-blank lines beside the one caption that starts ``Table N:`` (which
    must be the caption the pack quotes in ``where``), as (1-based line number, text)."""
    at = [i for i, line in enumerate(lines) if line.startswith(f"{pack['table']}:")]
    assert len(at) == 1, f"{pack['name']}: {len(at)} captions start {pack['table']}: in {pack['source']}"
    quoted = re.search(r'"([^"]+)"', pack["where"])
    assert quoted, f"{pack['name']}: 'where' quotes no caption"
    caption = norm(lines[at[0]] + " " + lines[at[0] + 1])  # a caption may wrap onto the next line
    assert norm(quoted[1]) in caption, f"{pack['name']}: the caption {caption!r} is not {quoted[1]!r}"
    step = -1 if SPECS[pack["name"]].caption_below else 1
    i = at[0] + step
    while not lines[i].strip():
        i += step
    block = []
    while 0 <= i < len(lines) and lines[i].strip():
        block.append((i + 1, lines[i]))
        i += step
    return block[::step]


def cells(pack: dict[str, Any], lines: list[str]) -> dict[Key, Cell]:
    """The pack's table read from the paper's text, its datasets named as in the pack."""
    spec = SPECS[pack["name"]]
    grid = spec.parse(table_lines(pack, lines))
    renamed = {printed: ours for printed, (ours, _) in spec.renamed.items()}
    return {(m, label, renamed.get(ds, ds), name): cell for (m, label, ds, name), cell in grid.items()}


def printed(text: str) -> tuple[float, int] | None:
    """A printed number and its count of decimals, or None where the cell holds no number."""
    m = NUMBER.fullmatch(text)
    return (float(m[1]), len(m[2] or "")) if m else None


def place(pack: dict[str, Any], i: int, name: str) -> str:
    """How a report names a number: pack, row (index, model, label, dataset) and metric."""
    row = pack["rows"][i]
    model = f"{row['model']} / " if row.get("model") else ""
    return f"{pack['name']}: row {i} ({model}{row['label']} / {row['dataset']}) {name}"


@dataclass
class Audit:
    checked: Counter[str] = field(default_factory=Counter)  # numbers found at their place, per field
    problems: list[str] = field(default_factory=list)


def audit(pack: dict[str, Any], lines: list[str]) -> Audit:
    """Every number of ``pack`` (its rows' ``paper`` metrics and ``tau``) against the cell at its place in
    the paper's table (``lines``: the paper's text), and every printed cell against the pack's rows."""
    spec, table, result = SPECS[pack["name"]], cells(pack, lines), Audit()
    held: set[Key] = set()
    for i, row in enumerate(pack["rows"]):
        for name, value in {**row["paper"], "tau": row.get("tau")}.items():
            key: Key = (row.get("model"), row["label"], row["dataset"], name)
            held.add(key)
            cell = table.get(key)
            number = printed(cell.text) if cell else None
            shown = f"paper prints {cell.text!r} (line {cell.line})" if cell else "paper prints nothing there"
            if value is None:
                if number is not None:
                    result.problems.append(f"{place(pack, i, name)}: pack has null, {shown}")
                continue
            scale = spec.scale.get(name, (1.0, ""))[0]
            if number is None or not math.isclose(
                value / scale, number[0], rel_tol=0, abs_tol=SLACK * 10 ** -number[1]
            ):
                converted = f" (= {value / scale:g} on the paper's scale)" if scale != 1 else ""
                result.problems.append(f"{place(pack, i, name)}: pack has {value}{converted}, {shown}")
                continue
            result.checked[name] += 1
    for (model, label, dataset, name), cell in table.items():  # a printed number that no row holds
        if (model, label, dataset, name) in held or dataset in spec.left_out or name in spec.left_out:
            continue
        if printed(cell.text) is not None:
            who = f"{model} / " if model else ""
            result.problems.append(
                f"{pack['name']}: no row holds {cell.text!r} ({who}{label} / {dataset} / {name}, line {cell.line})"
            )
    return result


# -- the tests ---------------------------------------------------------------------------------------------

# Numbers checked per pack. 565 are table cells, as the manual audit counted them: the 556 non-null `paper`
# metrics (DTR 250, ETC 147, PAIRS 114, TARG 45) and TARG's 9 τ cells. DTR's 30 non-null tau are checked too,
# but the paper prints u inside the row label ("DTR ($u = 0.001$)"), not in a cell: counted apart.
CELLS = {"dtr-table2": 250, "etc-table2": 147, "pairs-table2": 114, "targ-table1": 45 + 9}
IN_LABELS = {"dtr-table2": 30}


@pytest.fixture(scope="module")
def papers() -> dict[str, list[str]]:
    """Each pack's paper, as lines."""
    return {
        name: (PAPERS / load_pack(name)["source"]).read_text(encoding="utf-8").splitlines()
        for name in pack_names()
    }


def test_every_pack_has_a_parser() -> None:
    assert sorted(SPECS) == pack_names()


def test_the_counts_add_up_to_the_manual_audit() -> None:
    assert sum(CELLS.values()) == 565


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_number_is_at_its_place_in_the_paper(name: str, papers: dict[str, list[str]]) -> None:
    result = audit(load_pack(name), papers[name])
    assert result.problems == []
    in_labels = result.checked["tau"] if name in IN_LABELS else 0
    assert (sum(result.checked.values()) - in_labels, in_labels) == (CELLS[name], IN_LABELS.get(name, 0))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_difference_from_the_table_is_in_the_notes(name: str, papers: dict[str, list[str]]) -> None:
    pack, spec = load_pack(name), SPECS[name]
    notes = " ".join(pack["notes"])
    documented = [p for _, p in spec.scale.values()] + [p for _, p in spec.renamed.values()]
    assert [p for p in documented + list(spec.left_out.values()) if p not in notes] == []
    # each left-out column is one the table prints; its other columns are the pack's datasets (renamed)
    table = cells(pack, papers[name])
    printed_names = {k[2] for k in table} | {k[3] for k in table}
    assert set(spec.left_out) <= printed_names
    assert {d["paper"] for d in pack["datasets"]} == {k[2] for k in table} - set(spec.left_out)


def _find(pack: dict[str, Any], model: str | None, label: str, dataset: str) -> int:
    return next(
        i
        for i, r in enumerate(pack["rows"])
        if (r.get("model"), r["label"], r["dataset"]) == (model, label, dataset)
    )


# (pack, model, label, dataset, field): each kind of number of each pack, each conversion
NUDGES = [
    ("dtr-table2", "Qwen2.5-7B-Instruct", "CoT", "SQuAD", "em"),
    ("dtr-table2", "Qwen2.5-72B-Instruct", "LLM Judge (7B)", "WebQA", "f1"),
    ("dtr-table2", "Qwen2.5-72B-Instruct", "DTR (u = 0.005)", "TriviaQA", "retrieval_rate"),
    ("dtr-table2", "Qwen2.5-7B-Instruct", "DTR (u = 0.01)", "HotpotQA", "tau"),
    ("etc-table2", "Llama3-8b", "ETC(Ours)", "HotpotQA", "em"),
    ("etc-table2", "Vicuna-13b", "FLARE", "IIRC", "f1"),
    ("etc-table2", "Llama2-7b", "DRAGIN", "StrategyQA", "acc"),
    ("pairs-table2", None, "DPR-AIS-rerank", "SQuAD", "em"),
    ("pairs-table2", None, "No Retrieval", "TriviaQA", "f1"),
    ("pairs-table2", None, "PAIRS", "2WikiQA", "retrieval_rate"),
    ("targ-table1", None, "NEVER", "PopQA", "em"),
    ("targ-table1", None, "VARIANCE", "NQ-Open", "f1"),
    ("targ-table1", None, "ENTROPY", "TriviaQA", "retrieval_rate"),
    ("targ-table1", None, "MARGIN", "PopQA", "tau"),
]


@pytest.mark.parametrize(("name", "model", "label", "dataset", "metric"), NUDGES)
def test_a_number_one_printed_digit_off_is_reported(
    name: str, model: str | None, label: str, dataset: str, metric: str, papers: dict[str, list[str]]
) -> None:
    pack = copy.deepcopy(load_pack(name))
    i = _find(pack, model, label, dataset)
    row = pack["rows"][i]
    number = printed(cells(pack, papers[name])[model, label, dataset, metric].text)
    assert number is not None
    digit = 10 ** -number[1] * SPECS[name].scale.get(metric, (1.0, ""))[0]  # the last printed digit, as held
    holder = row if metric == "tau" else row["paper"]
    holder[metric] += digit
    problems = audit(pack, papers[name]).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{place(pack, i, metric)}: pack has {holder[metric]}")
    assert "paper prints " in problems[0]
    assert all(part in problems[0] for part in (name, f"row {i}", label, dataset, metric))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_right_number_in_the_wrong_column_is_reported(name: str, papers: dict[str, list[str]]) -> None:
    """One row's EM and F1 swapped, and its EM copied into the same method's row of another dataset: numbers
    the table prints, at the wrong places."""
    pack = copy.deepcopy(load_pack(name))
    rows = pack["rows"]
    i = next(i for i, r in enumerate(rows) if r["paper"]["em"] not in (None, r["paper"]["f1"]))
    em, method = rows[i]["paper"]["em"], (rows[i].get("model"), rows[i]["label"])
    rows[i]["paper"]["em"], rows[i]["paper"]["f1"] = rows[i]["paper"]["f1"], em
    k = next(
        k
        for k, r in enumerate(rows)
        if k != i and (r.get("model"), r["label"]) == method and r["paper"]["em"] not in (None, em)
    )
    rows[k]["paper"]["em"] = em
    problems = audit(pack, papers[name]).problems
    expected = [place(pack, r, m) for r, m in sorted([(i, "em"), (i, "f1"), (k, "em")])]
    assert [p.split(": pack has ")[0] for p in problems] == expected


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_null_or_a_missing_row_where_the_paper_prints_numbers_is_reported(
    name: str, papers: dict[str, list[str]]
) -> None:
    pack = copy.deepcopy(load_pack(name))
    em = pack["rows"][0]["paper"]["em"]
    pack["rows"][0]["paper"]["em"] = None
    problems = audit(pack, papers[name]).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{place(pack, 0, 'em')}: pack has null, paper prints ")
    pack["rows"][0]["paper"]["em"] = em
    gone = pack["rows"].pop(-1)
    problems = audit(pack, papers[name]).problems
    held = [v for v in [*gone["paper"].values(), gone.get("tau")] if v is not None]
    assert len(problems) == len(held) and all(p.startswith(f"{name}: no row holds ") for p in problems)
    assert all(f"{gone['label']} / {gone['dataset']}" in p for p in problems)
