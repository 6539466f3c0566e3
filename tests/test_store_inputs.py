"""The store's commands under bad input: cards checked on load (issue 20, item 4), failed ingests
that leave nothing half-made and answer in one line (item 6), no silent surprises (item 7), and
dataset pickles that cannot run code (item 9). The commands run in-process through the CLI.

Every test that makes or reads a store runs on each backend (the ``backend`` fixture: embedded,
Milvus Lite), the backend of a new store given by a params file (``store.backend``); what a refused
command leaves is checked with the backend's own listing of its vectors (``stored_spaces``)."""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from modelupgrade.cli import main
from modelupgrade.errors import UserError
from modelupgrade.models import save_model
from modelupgrade.store import BackendSettings, GalleryStore
from tests.model_fixtures import tiny_model
from tests.store_helpers import (
    PROJECT_PARAMS,
    PROJECT_ROOT,
    backend_params,
    exit_code_and_output,
    stored_spaces,
)

DIM = 8
ITEMS = 6


@pytest.fixture(autouse=True)
def quiet_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only warnings on stderr, so that what a command prints there is its error alone."""
    monkeypatch.setenv("MODELUPGRADE_LOG_LEVEL", "WARNING")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/gen0 and models/gen1: two tiny 8-d models, the second the first's child."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    save_model(tiny_model(DIM), root / "gen0", {"generation": 0})
    torch.manual_seed(1)
    save_model(tiny_model(DIM), root / "gen1", {"generation": 1})
    return root


def _items(path: Path, **columns: list) -> Path:
    frame = pd.DataFrame(
        {
            "item_id": [f"it{i}" for i in range(ITEMS)],
            "path": [f"{i}.png" for i in range(ITEMS)],
            "index": [-1] * ITEMS,
            "label": [i % 3 for i in range(ITEMS)],
        }
    )
    for name, values in columns.items():
        frame[name] = values
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return path


def _vectors(path: Path, array: np.ndarray | None = None) -> Path:
    rng = np.random.default_rng(0)
    np.save(path, rng.normal(size=(ITEMS, DIM)).astype(np.float32) if array is None else array)
    return path


def _run(
    capsys: pytest.CaptureFixture[str], *argv: str, params: Path = PROJECT_PARAMS
) -> tuple[int, str, str]:
    return exit_code_and_output(capsys, lambda: main([argv[0], "--params", str(params), *argv[1:]]))


def _refused(
    capsys: pytest.CaptureFixture[str],
    *argv: str,
    match: str,
    hint: bool = True,
    params: Path = PROJECT_PARAMS,
) -> str:
    """Run a command that must fail as one error line (with a hint) and exit code 2."""
    code, out, err = _run(capsys, *argv, params=params)
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert lines[0].startswith("error: ") and re.search(match, lines[0]), err
    assert len(lines) == (2 if hint else len(lines)) and (not hint or "hint:" in lines[1]), err
    return err


def _ingest(store: Path, items: Path, model: Path, vectors: Path, *extra: str) -> list[str]:
    return [
        "store-ingest",
        "--store",
        str(store),
        "--items",
        str(items),
        "--model",
        str(model),
        "--vectors",
        str(vectors),
        *extra,
    ]


def _nothing_left(where: Path, store: Path) -> None:
    assert not store.exists()
    assert not [p for p in where.iterdir() if p.name.startswith(f".{store.name}.")]


# ----- item 4: cards verified on load ------------------------------------------------------------
def test_a_model_whose_weights_are_not_its_cards_is_refused_even_when_nothing_embeds(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    swapped = tmp_path / "gen1-bct"
    swapped.mkdir()
    (swapped / "card.json").write_bytes((models / "gen1" / "card.json").read_bytes())
    (swapped / "checkpoint.pt").write_bytes((models / "gen0" / "checkpoint.pt").read_bytes())
    items, vectors = _items(tmp_path / "items.parquet"), _vectors(tmp_path / "v.npy")
    store = tmp_path / "store"
    # --score with no value: no score is computed, so the weights are never loaded.
    _refused(
        capsys,
        *_ingest(store, items, swapped, vectors, "--score"),
        match="is not the file its card describes",
        params=backend_params(tmp_path, backend),
    )
    _nothing_left(tmp_path, store)


def _head(path: Path, old_model: Path, new_model: Path) -> Path:
    from modelupgrade.heads import build_head
    from modelupgrade.heads.persistence import save_head
    from modelupgrade.heads.pipeline import source_entry

    torch.manual_seed(2)
    head = build_head("bict", DIM, DIM, 8, 1)
    save_head(
        head,
        path,
        name="bict",
        sources={"old_model": source_entry(old_model), "new_model": source_entry(new_model)},
    )
    return path


def test_a_transform_head_trained_for_another_model_pair_is_refused(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    params = backend_params(tmp_path, backend)
    items, vectors = _items(tmp_path / "items.parquet"), _vectors(tmp_path / "v.npy")
    head = _head(tmp_path / "bict-gen1", models / "gen0", models / "gen1")
    # The store holds gen1's vectors; the head maps gen0's.
    store = tmp_path / "store"
    ingest = _ingest(store, items, models / "gen1", vectors, "--score")
    assert _run(capsys, *ingest, params=params)[0] == 0
    backfill = ["backfill", "--store", str(store), "--transform-head", str(head)]
    _refused(
        capsys,
        *backfill,
        "--space",
        "gen2",
        "--no-progress",
        match=r"trained with .*gen0 as its old model, but space 'gen1' holds",
        params=params,
    )
    with GalleryStore.open(store) as gallery:
        assert set(gallery.spaces()) == {"gen1"} and gallery.backfills.active() is None
        assert gallery.status().vectors["backend"] == backend.kind
        assert stored_spaces(gallery) == {"gen1"}
    # The store of gen0's vectors is what the head was trained for: the backfill runs.
    right = tmp_path / "right"
    ingest = _ingest(right, items, models / "gen0", vectors, "--score")
    assert _run(capsys, *ingest, params=params)[0] == 0
    code, _, err = _run(
        capsys,
        "backfill",
        "--store",
        str(right),
        "--transform-head",
        str(head),
        "--space",
        "gen1",
        "--policy",
        "ingest-order",
        "--no-progress",
        params=params,
    )
    assert code == 0, err
    with GalleryStore.open(right) as gallery:
        assert gallery.status().items_by_space == {"gen1": ITEMS}
        assert stored_spaces(gallery) == {"gen0", "gen1"}


# ----- item 6: a failed ingest leaves nothing and says one line ----------------------------------
@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("nan-vectors", "NaN or infinite"),
        ("wrong-dimension", "dimension 5"),
        ("one-dimensional", "2-D array"),
        ("objects", "Python objects"),
        ("duplicate-ids", "not unique, e.g. 'it0'"),
        ("unknown-score", "unknown ordering score 'bogus'"),
        ("nan-label", "'label' is not a whole number"),
        ("text-items", "neither .parquet nor .csv"),
    ],
)
def test_a_refused_ingest_leaves_no_store_and_says_one_line(
    tmp_path: Path,
    models: Path,
    backend: BackendSettings,
    capsys: pytest.CaptureFixture[str],
    case: str,
    match: str,
) -> None:
    items, vectors, extra = tmp_path / "items.parquet", tmp_path / "v.npy", []
    good = np.random.default_rng(0).normal(size=(ITEMS, DIM)).astype(np.float32)
    array: np.ndarray = good
    columns: dict[str, list] = {}
    if case == "nan-vectors":
        array = good.copy()
        array[2, 3] = np.nan
    elif case == "wrong-dimension":
        array = good[:, :5]
    elif case == "one-dimensional":
        array = good.ravel()
    elif case == "objects":
        array = np.array([{"v": 1}] * ITEMS, dtype=object)
    elif case == "duplicate-ids":
        columns["item_id"] = ["it0", *[f"it{i}" for i in range(1, ITEMS - 1)], "it0"]
    elif case == "unknown-score":
        extra = ["--score", "bogus"]
    elif case == "nan-label":
        columns["label"] = [0, 1, float("nan"), 0, 1, 2]
    if case == "objects":
        np.save(vectors, array, allow_pickle=True)
    else:
        _vectors(vectors, array)
    _items(items, **columns)
    if case == "text-items":
        items = items.rename(tmp_path / "items.txt")
    store = tmp_path / "store"
    params = backend_params(tmp_path, backend)
    ingest = _ingest(store, items, models / "gen0", vectors, *extra)
    _refused(capsys, *ingest, match=match, params=params)
    _nothing_left(tmp_path, store)


def test_a_refused_ingest_into_an_existing_store_leaves_it_as_it_was(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    params = backend_params(tmp_path, backend)
    items, vectors = _items(tmp_path / "items.parquet"), _vectors(tmp_path / "v.npy")
    store = tmp_path / "store"
    ingest = _ingest(store, items, models / "gen0", vectors, "--score")
    assert _run(capsys, *ingest, params=params)[0] == 0
    with GalleryStore.open(store) as gallery:
        before = gallery.status().as_dict()
        assert before["vectors"]["backend"] == backend.kind
    _refused(
        capsys,
        *_ingest(store, items, models / "gen1", vectors, "--score", "--space", "other"),
        match="already in the store",
        params=params,
    )
    with GalleryStore.open(store) as gallery:
        assert gallery.status().as_dict() == before
        assert stored_spaces(gallery) == {"gen0"}


def test_a_csv_items_file_is_read_like_a_parquet_one(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    items = _items(tmp_path / "items.csv", item_id=[f"00{i}" for i in range(ITEMS)])
    vectors = _vectors(tmp_path / "v.npy")
    store = tmp_path / "store"
    ingest = _ingest(store, items, models / "gen0", vectors, "--score")
    code, _, err = _run(capsys, *ingest, params=backend_params(tmp_path, backend))
    assert code == 0, err
    with GalleryStore.open(store) as gallery:
        rows = gallery.items()
        np.testing.assert_array_equal(
            gallery.read_vectors("gen0", np.arange(ITEMS)), np.load(vectors)
        )
    assert [r.item_id for r in rows] == [f"00{i}" for i in range(ITEMS)]
    assert [r.label for r in rows] == [i % 3 for i in range(ITEMS)]


def test_ingest_never_replaces_a_directory_that_is_not_a_store(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    items, vectors = _items(tmp_path / "items.parquet"), _vectors(tmp_path / "v.npy")
    precious = tmp_path / "documents"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    _refused(
        capsys,
        *_ingest(precious, items, models / "gen0", vectors, "--score"),
        match="exists and is not a gallery store",
        params=backend_params(tmp_path, backend),
    )
    assert (precious / "thesis.txt").read_text() == "years of work"
    assert [p.name for p in precious.iterdir()] == ["thesis.txt"]


def _rehash(directory: Path, file_name: str) -> None:
    from modelupgrade.io import file_sha256

    card = json.loads((directory / "card.json").read_text())
    card["weights_sha256"][file_name] = file_sha256(directory / file_name)
    (directory / "card.json").write_text(json.dumps(card))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("truncated", "cannot be loaded as weights"),
        ("not-a-state-dict", "holds a list, not a state dict"),
        ("card-not-json", "is not valid JSON"),
        ("card-a-list", "is not a model card"),
    ],
)
def test_a_damaged_model_directory_is_one_error_line(
    tmp_path: Path,
    models: Path,
    backend: BackendSettings,
    capsys: pytest.CaptureFixture[str],
    damage: str,
    match: str,
) -> None:
    model = tmp_path / "gen0"
    model.mkdir()
    for name in ("card.json", "checkpoint.pt"):
        (model / name).write_bytes((models / "gen0" / name).read_bytes())
    if damage == "truncated":
        (model / "checkpoint.pt").write_bytes((model / "checkpoint.pt").read_bytes()[:300])
        _rehash(model, "checkpoint.pt")
    elif damage == "not-a-state-dict":
        torch.save([torch.zeros(2)], model / "checkpoint.pt")
        _rehash(model, "checkpoint.pt")
    elif damage == "card-not-json":
        (model / "card.json").write_bytes(b"\x00\x01{")
    else:
        (model / "card.json").write_text("[1, 2]")
    items, vectors = _items(tmp_path / "items.parquet"), _vectors(tmp_path / "v.npy")
    # The default scores run the model's classifier: its weights are loaded.
    params = backend_params(tmp_path, backend)
    ingest = _ingest(tmp_path / "s", items, model, vectors)
    _refused(capsys, *ingest, match=match, hint=False, params=params)
    _nothing_left(tmp_path, tmp_path / "s")


# ----- item 7: no silent surprises ---------------------------------------------------------------
def test_search_refuses_k_0_and_rows_it_does_not_define(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    items, vectors = _items(tmp_path / "items.parquet"), _vectors(tmp_path / "v.npy")
    store = tmp_path / "store"
    ingest = _ingest(store, items, models / "gen0", vectors, "--score")
    assert _run(capsys, *ingest, params=backend_params(tmp_path, backend))[0] == 0
    search = ["search", "--store", str(store), "--queries", str(vectors)]
    _refused(capsys, *search, "--k", "0", match="--k must be at least 1, got 0")
    for rows in ("3:", ":2", "a:b", "4:2", "9"):
        _refused(capsys, *search, "--rows", rows, match="--rows")
    one = np.zeros(DIM, np.float32)
    np.save(tmp_path / "one.npy", one)
    _refused(
        capsys,
        "search",
        "--store",
        str(store),
        "--queries",
        str(tmp_path / "one.npy"),
        match="must hold a 2-D array",
    )
    code, out, _ = _run(capsys, *search, "--rows", "3", "--k", "2", "--json")
    assert code == 0 and [q["query"] for q in json.loads(out)] == ["row 3"]
    assert len(json.loads(out)[0]["hits"]) == 2


def test_a_missing_or_invalid_params_file_stops_the_store_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["store-status"], ["search", "--k", "3"], ["serve"]):
        with pytest.raises(SystemExit) as stop:
            main([*argv, "--params", str(tmp_path / "params.yml")])
        assert stop.value.code == 2
        assert "params.yml does not exist" in capsys.readouterr().err
    import yaml

    raw = yaml.safe_load(PROJECT_PARAMS.read_text())
    raw["store"] = {**raw.get("store", {}), "policy": "oracle-nope", "serving_mode": "nope"}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as stop:
        main(["store-status", "--params", str(bad)])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "store.policy: unknown" in err and "store.serving_mode: unknown" in err


def test_lineage_of_an_unknown_model_fails_and_creates_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelupgrade.commands.registry import lineage
    from modelupgrade.params import load_params

    params = load_params(PROJECT_PARAMS)
    with pytest.raises(UserError, match="no registered model named 'nobody-here'"):
        lineage(params, model="nobody-here")  # the tests' in-memory tracking store
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["lineage", "--params", str(PROJECT_PARAMS), "--model", "nobody-here"])
    assert stop.value.code == 2
    assert "no tracking database" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_file_that_is_no_image_fails_data_validation(tmp_path: Path) -> None:
    from modelupgrade.data.validation import Validator, validate_manifest
    from tests.data_fixtures import write_png

    for i in range(4):
        write_png(tmp_path / f"{i}.png", (i * 60, 0, 0))
    (tmp_path / "4.png").write_text("a text file named like an image")
    manifest = pd.DataFrame(
        {
            "item_id": [f"i{i}" for i in range(5)],
            "label": [0, 0, 1, 1, 1],
            "class_name": ["a", "a", "b", "b", "b"],
            "source_split": ["train"] * 5,
            "path": [f"{i}.png" for i in range(5)],
            "index": [-1] * 5,
        }
    )
    report = validate_manifest(Validator(), manifest, tmp_path, 1, "train")
    failures = [(f.column, [e.get("item_id") for e in f.examples]) for f in report.failures]
    assert failures == [("image_file_readable", ["i4"])]


def test_a_nan_label_in_a_csv_manifest_is_named_as_missing(tmp_path: Path) -> None:
    from modelupgrade.data import build_manifest
    from tests.data_fixtures import make_params

    (tmp_path / "labels.csv").write_text("path,label\na.png,cat\nb.png,nan\nc.png,dog\n")
    dataset = make_params(tmp_path, loader="manifest", manifest_file="labels.csv").dataset
    with pytest.raises(UserError, match=r"mark a missing value, not a class \(lines 3 \('nan'\)"):
        build_manifest(dataset)


def _cli_options() -> set[str]:
    """Every option of every command, stage and flow: their functions' parameters."""
    options = {"--params", "--json", "--help"}
    for root in ("modelupgrade/commands", "stages", "flows"):
        for source in sorted((PROJECT_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                    for argument in node.args.args + node.args.kwonlyargs:
                        flag = argument.arg.replace("_", "-")
                        options |= {f"--{flag}", f"--no-{flag}"}
    return options


# Error texts that quote another program's command line name its options, not ours.
OTHER_PROGRAMS = ("torchrun", "prefect ")


def test_every_option_an_error_or_hint_names_exists() -> None:
    options = _cli_options()
    wrong = []
    for root in ("modelupgrade", "stages", "flows"):
        for source in sorted((PROJECT_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                    texts = [node] if name.endswith("Error") else []
                elif isinstance(node, ast.Assign):
                    named_hint = any(getattr(t, "id", "") == "hint" for t in node.targets)
                    texts = [node.value] if named_hint else []
                else:
                    continue
                strings = [
                    sub.value
                    for text in texts
                    for sub in ast.walk(text)
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                ]
                if any(program in s for s in strings for program in OTHER_PROGRAMS):
                    continue
                for string in strings:
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", string):
                        if flag not in options:
                            wrong.append(f"{source.relative_to(PROJECT_ROOT)}: {flag}")
    assert not wrong, wrong


# ----- item 9: dataset pickles cannot run code ---------------------------------------------------
class _RunsCode:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        import os

        return (os.system, ("touch pwned",))


def test_a_dataset_pickle_that_would_run_code_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelupgrade.data.pickles import load_data_pickle

    monkeypatch.chdir(tmp_path)
    (tmp_path / "gnd.pkl").write_bytes(pickle.dumps({"imlist": _RunsCode()}))
    with pytest.raises(UserError, match=r"names posix\.system, which no dataset file needs"):
        load_data_pickle(tmp_path / "gnd.pkl", "ground-truth file")
    assert not (tmp_path / "pwned").exists()
    data = {b"data": np.arange(6, dtype=np.uint8).reshape(2, 3), b"labels": [1, 2], b"name": "x"}
    (tmp_path / "batch").write_bytes(pickle.dumps(data, protocol=2))
    loaded = load_data_pickle(tmp_path / "batch", "CIFAR file", encoding="bytes")
    np.testing.assert_array_equal(loaded[b"data"], data[b"data"])
    assert loaded[b"labels"] == [1, 2] and loaded[b"name"] == "x"


# ----- issue 31, item 2: the one vector format, looked up by id ----------------------------------
def test_ingest_and_backfill_take_an_item_id_and_embedding_table_looked_up_by_id(
    tmp_path: Path, models: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelupgrade.data.vector_table import write_vector_table

    params = backend_params(tmp_path, backend)
    store, items = tmp_path / "store", _items(tmp_path / "items.parquet")
    ids = [f"it{i}" for i in range(ITEMS)]
    rng = np.random.default_rng(3)
    old, new = (rng.normal(size=(ITEMS, DIM)).astype(np.float32) for _ in range(2))
    # Tables as a team exports them: another order than the items table, and an extra item.
    order = [4, 0, 5, 2, 1, 3]
    extra_old, extra_new = rng.normal(size=(1, DIM)), rng.normal(size=(1, DIM))
    old_table = write_vector_table(
        tmp_path / "old.parquet",
        [ids[i] for i in order] + ["other"],
        np.vstack([old[order], extra_old]),
    )
    new_table = write_vector_table(
        tmp_path / "new.parquet",
        ["other"] + [ids[i] for i in order],
        np.vstack([extra_new, new[order]]),
    )
    code, _, err = _run(
        capsys, *_ingest(store, items, models / "gen0", old_table, "--score"), params=params
    )
    assert code == 0, err
    backfill = ["backfill", "--store", str(store), "--space", "gen1", "--policy", "random"]
    # A table names its own rows: --items is for a .npy matrix only, and a matrix needs it.
    both = [*backfill, "--vectors", str(new_table), "--items", str(items)]
    _refused(capsys, *both, match="--items names the rows of a .npy --vectors", params=params)
    matrix = [*backfill, "--vectors", str(_vectors(tmp_path / "new.npy", new))]
    _refused(capsys, *matrix, match="a .npy matrix needs --items", params=params)
    code, _, err = _run(capsys, *backfill, "--vectors", str(new_table), params=params)
    assert code == 0, err
    with GalleryStore.open(store) as opened:
        slots = np.array([item.slot for item in sorted(opened.items(), key=lambda i: i.item_id)])
        np.testing.assert_array_equal(opened.read_vectors("gen0", slots), old)
        np.testing.assert_array_equal(opened.read_vectors("gen1", slots), new)
        assert opened.status().items_by_space == {"gen1": ITEMS}
