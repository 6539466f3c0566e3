"""A plan you can execute: every fitted adapter saved as a head directory that the store takes,
the commands that carry out an option printed (and here run: dry run, backfill, cutover), and
costs that say how stable they are."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
import torch

from modelupgrade.cli import main
from modelupgrade.commands.plan import plan
from modelupgrade.commands.store import store_ingest
from modelupgrade.commands.training import embed
from modelupgrade.evaluation import RetrievalEvaluator
from modelupgrade.heads import FrozenHead, load_head
from modelupgrade.models import embed as embed_images
from modelupgrade.models import load_model
from modelupgrade.params import load_params
from modelupgrade.plan import Recommendation
from modelupgrade.plan.records import MachineLoad
from modelupgrade.plan.steps import PlanContext, next_steps
from modelupgrade.store import GalleryStore
from tests.data_fixtures import write_params_yaml
from tests.test_plan import write_models


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """A plan of the test_plan models on a query and a gallery file, with a store of the gallery
    ingested with the old model's vectors, and params read from a file (the commands name it)."""
    monkeypatch.chdir(tmp_path)
    setup = write_models(tmp_path, monkeypatch, old_noise=0.2)
    params = load_params(write_params_yaml(tmp_path / "params.yaml", setup["params"]))
    sample = pd.read_parquet(setup["sample"])
    sample.iloc[::3].to_parquet(tmp_path / "queries.parquet")
    gallery = sample.drop(index=sample.index[::3])
    gallery.to_parquet(tmp_path / "gallery.parquet")
    written = plan(
        params,
        setup["old"],
        setup["new"],
        setup["sample"],
        gallery_size=10**8,
        out=Path("plan"),
        query=tmp_path / "queries.parquet",
        gallery=tmp_path / "gallery.parquet",
        adapters=["affine_query", "affine"],
        store=Path("stores/gallery"),
    )
    vectors = embed(params, setup["old"], split=[tmp_path / "gallery.parquet"], out=Path("old.npy"))
    store_ingest(
        params,
        tmp_path / "gallery.parquet",
        setup["old"],
        store=Path("stores/gallery"),
        vectors=vectors.paths[0],
        score=(),
    )
    return {**setup, "params": params, "written": written}


def run_printed(command: str) -> None:
    argv = shlex.split(command)
    assert argv[0] == "modelupgrade"
    main(argv[1:])


def test_every_adapter_is_saved_as_a_head_the_plan_scored_and_names_its_models(planned):
    table = planned["written"].plan
    frames = [pd.read_parquet(f"{name}.parquet") for name in ("queries", "gallery")]
    evaluator = RetrievalEvaluator.from_frames(planned["params"].evaluation, *frames)
    old, new = (load_model(planned[side]) for side in ("old", "new"))
    images = [planned["images"][torch.as_tensor(f["index"].to_numpy())] for f in frames]
    for option in ("query/affine", "gallery/affine"):
        row = table.row(option)
        head, card = load_head(Path("plan") / row.head)
        assert card.sources["old_model"]["path"] == str(planned["old"])
        assert card.sources["new_model"]["path"] == str(planned["new"])
        assert card.name == option and card.training["fit_cosine"] > 0.5
        # The saved head gives the M the plan reported for it.
        psi = FrozenHead(head, "cpu").output("transform")
        if option.startswith("query"):
            pair = psi(embed_images(new, images[0])), embed_images(old, images[1])
        else:
            pair = embed_images(new, images[0]), psi(embed_images(old, images[1]))
        assert evaluator.evaluate(*pair).metrics["mAP"] == pytest.approx(row.M, abs=1e-6)
    assert table.row("query/affine").head == "heads/query-affine"
    saved = json.loads(Path("plan/plan.json").read_text())
    assert [r["head"] for r in saved["rows"]][:4] == [
        None,
        None,
        "heads/query-affine",
        "heads/gallery-affine",
    ]


def test_the_printed_commands_carry_out_a_gallery_adapter_and_a_reembedding(planned):
    written = planned["written"]
    table = written.plan
    # What the command printed is next_steps of its recommendation, also in plan.json.
    saved = json.loads(Path("plan/plan.json").read_text())
    assert saved["next_commands"] == [step.command for step in written.steps]
    assert all(step.command in written.describe() for step in written.steps)
    context = PlanContext(
        planned["params"].source,
        planned["old"],
        planned["new"],
        Path("queries.parquet").resolve(),
        Path("stores/gallery"),
        Path("plan"),
    )
    chosen = dataclasses.replace(table, recommendation=Recommendation("gallery/affine", "test"))
    steps = next_steps(chosen, context)
    assert [s.argv[1] for s in steps] == ["backfill", "backfill", "cutover"]
    assert "--transform-head" in steps[0].argv and "--dry-run" in steps[0].argv
    for step in steps:
        run_printed(step.command)
    with GalleryStore.open("stores/gallery") as store:
        status = store.status().as_dict()
    assert status["serving_space"] == "new" and status["serving_steps"][0]["step"] == "cutover"
    # Re-embedding: the new model's own vectors this time (a new store of the same gallery).
    main(["rollback", "--params", "params.yaml", "--store", "stores/gallery", "--reason", "again"])
    reembed = dataclasses.replace(table, recommendation=Recommendation("reembed", "test"))
    argv = [s.argv for s in next_steps(reembed, context)]
    assert "--model" in argv[1] and argv[1][argv[1].index("--model") + 1] == str(planned["new"])


def test_the_costs_say_how_stable_they_are_and_whether_the_machine_was_busy(planned):
    table = planned["written"].plan
    assert table.row("reembed").timing_spread >= 1.0
    assert table.row("gallery/affine").timing_spread >= 1.0
    assert "timing rounds" in table.markdown()
    measurements = dataclasses.replace(
        table.measurements, machine=MachineLoad(cores=2, load_before=6.1, load_after=5.8)
    )
    busy = dataclasses.replace(table, measurements=measurements)
    assert "**The machine was busy while timing** (load average 6.1 on 2 cores)" in busy.markdown()
    quiet = dataclasses.replace(
        table, measurements=dataclasses.replace(measurements, machine=MachineLoad(2, 0.2, 0.3))
    )
    assert "was quiet while timing" in quiet.markdown()
