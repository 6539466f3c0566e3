"""Your own upgrade through ``dvc repro``, as docs/your-upgrade.md walks it (issue 31, item 6): a
team's JPEG folder named by its SKUs, its production model (a torchvision state dict whose ``fc`` is
the embedding) and its candidate (a timm network of another dimension, as TorchScript), both made
here with torchvision and timm directly and placed where params/your-upgrade.yaml names them. The
profile runs as the walk-through says (``modelupgrade experiments --overlay
params/your-upgrade.yaml --target upgrade``) in a git and DVC copy of the project; the upgrade's
report must lead with the plan, cell for cell, name the adopted models and the team's data, and
the stage must depend on its own entry only. The production model is worn out (its embedding cut
to rank 2) so that the plan recommends re-embedding; then the commands the plan printed, run as
printed, carry the upgrade out on the store they name, ingested with the production model's own
vectors (the ``item_id + embedding`` parquet a team exports): a dry run, the backfill, and the
cutover gate on the held-out queries.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from modelupgrade.cli import main
from modelupgrade.plan.table import read_plan
from modelupgrade.store import GalleryStore
from tests.byo_fixtures import (
    IMAGE_SIZE,
    NEW_DIM,
    OLD_DIM,
    write_jpeg_folder,
    write_new_torchscript,
    write_old_state_dict,
    write_plain_table,
)
from tests.processes import run_ok

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROFILE = Path("params/your-upgrade.yaml")
GIT_USER = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}


def _env(project: Path) -> dict[str, str]:
    return {
        **os.environ,
        **GIT_USER,
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        "PYTHONPATH": str(project),
    }


def _write_team_inputs(profile: dict, project: Path) -> pd.DataFrame:
    """The files the profile names, made as a team would make them: the images, both models and
    the sample, query and gallery tables (alternate images: half fit the adapters, a quarter are
    the held-out queries, a quarter the gallery)."""
    upgrade = profile["upgrades"]["mine"]
    inputs = project / upgrade["inputs"]
    rows = write_jpeg_folder(inputs / "images", per_class=12)
    production = project / profile["adopted"]["production"]["options"]["path"]
    write_old_state_dict(production)
    _wear_out(production)
    write_new_torchscript(project / profile["adopted"]["candidate"]["options"]["path"])
    n = rows.index.to_numpy()
    for role, keep in (("sample", n % 2 == 0), ("query", n % 4 == 1), ("gallery", n % 4 == 3)):
        write_plain_table(project / upgrade[role], rows[keep])
    return rows


def _wear_out(state_dict: Path) -> None:
    """The production model as an old, weak one: its 16-d embedding (fc) cut to rank 2, so the
    candidate is worth an upgrade and the plan recommends one whose commands the test runs."""
    weights = torch.load(state_dict)
    u, s, vh = torch.linalg.svd(weights["fc.weight"], full_matrices=False)
    weights["fc.weight"] = (u[:, :2] * s[:2]) @ vh[:2]
    torch.save(weights, state_dict)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git and DVC copy of the project with the team's inputs, the profile run through DVC."""
    project = tmp_path_factory.mktemp("your-upgrade") / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("modelupgrade", "stages"):
        shutil.copytree(ROOT / package, project / package, ignore=ignore)
    for name in ("dvc.yaml", "params.yaml", str(PROFILE)):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, project / name)
    env = _env(project)
    run_ok(["git", "init", "-q"], project, env)
    run_ok([str(BIN / "dvc"), "init", "-q"], project, env)
    run_ok(["git", "add", "-A"], project, env)
    run_ok(["git", "commit", "-qm", "the project"], project, env)
    profile = yaml.safe_load((ROOT / PROFILE).read_text(encoding="utf-8"))
    _write_team_inputs(profile, project)
    # The walk-through's one command: the study's stages stay as they are, untouched.
    command = ["modelupgrade", "experiments", "--overlay", str(PROFILE), "--target", "upgrade"]
    ran = run_ok([str(BIN / command[0]), *command[1:]], project, env, timeout=900)
    assert "Running stage 'upgrade@mine'" in ran.stdout + ran.stderr
    assert "Running stage 'train_old" not in ran.stdout + ran.stderr
    return project


def test_the_profile_through_dvc_plans_the_upgrade_and_its_report_leads_with_the_plan(project):
    out = project / "upgrades" / "mine"
    plan_md = (out / "plan" / "plan.md").read_text(encoding="utf-8")
    report = (out / "report" / "report.md").read_text(encoding="utf-8")
    saved = json.loads((out / "plan" / "plan.json").read_text(encoding="utf-8"))
    # The lead is the plan: its first section, its table the very lines of plan.md's.
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Your upgrade: mine"
    table = [line for line in plan_md.splitlines() if line.startswith("| ")]
    lead = report[: report.index("### The models")]
    assert table and [line for line in lead.splitlines() if line.startswith("| ")] == table
    recommended = saved["recommendation"]["option"]
    assert f"**Recommended: {recommended}.**" in lead
    assert len(saved["rows"]) == len(table) - 1 and all(
        f"| {row['option']} |" in lead for row in saved["rows"]
    )
    # It describes the team's data and models, not the paper study's.
    assert "sku-001000" in lead and f"{IMAGE_SIZE}×{IMAGE_SIZE}" in lead and "20,000,000" in lead
    assert "28×28" not in report and "Fashion" not in report
    models = report[report.index("### The models") :]
    assert (
        f"| production (old) | production | torchvision | production.pt | layer 'fc' | {OLD_DIM} |"
        in models
    )
    assert "| candidate (new) | candidate | torchscript | candidate.torchscript |" in models
    assert f"| {NEW_DIM} | yes |" in models
    # Adopted with their dimensions kept, every adapter saved as a head directory.
    for role, dim in (("old", OLD_DIM), ("new", NEW_DIM)):
        card = json.loads((out / "models" / role / "card.json").read_text(encoding="utf-8"))
        assert card["embedding_dim"] == dim
    heads = {p.name for p in (out / "plan" / "heads").iterdir()}
    assert {"gallery-affine", "query-procrustes", "gallery-local_procrustes"} <= heads
    assert (out / "report" / "report.html").is_file()
    # plan.json reads back as the plan it was written from: the same cells.
    assert ["| " + " | ".join(cells) + " |" for cells in read_plan(out / "plan").table_cells()] == (
        table[1:]
    )


def test_the_upgrade_stage_depends_on_its_own_entry_and_inputs_only(project):
    env = _env(project)
    dvc = str(BIN / "dvc")
    assert "up to date" in run_ok([dvc, "status", "upgrade"], project, env).stdout
    # A second upgrade beside it (another gallery size): only that one is new to run.
    params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
    params["upgrades"]["other"] = {**params["upgrades"]["mine"], "gallery_size": 1000}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = run_ok([dvc, "status", "upgrade", "--json"], project, env).stdout
    assert set(json.loads(status)) == {"upgrade@other"}
    # A file under the inputs changes: that upgrade's stage must run again.
    table = project / params["upgrades"]["mine"]["query"]
    pd.read_parquet(table).iloc[:-1].to_parquet(table, index=False)
    status = run_ok([dvc, "status", "upgrade", "--json"], project, env).stdout
    assert set(json.loads(status)) == {"upgrade@mine", "upgrade@other"}


def test_an_upgrade_that_reads_outside_its_inputs_is_one_clear_error(project, tmp_path, capsys):
    params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
    outside = tmp_path / "elsewhere.parquet"
    inside = project / params["upgrades"]["mine"]["gallery"]
    table = pd.read_parquet(inside)
    table["path"] = [str(inside.parent / path) for path in table["path"]]  # the images stay inside
    table.to_parquet(outside, index=False)
    params["upgrades"]["mine"]["gallery"] = str(outside)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    cwd = Path.cwd()
    os.chdir(project)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["upgrade", "--params", str(path), "--name", "mine", "--out", str(tmp_path / "u")])
    finally:
        os.chdir(cwd)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "lies outside upgrades.mine.inputs" in err and "would not see it change" in err
    assert not (tmp_path / "u").exists()


def _production_vectors(project: Path, gallery: pd.DataFrame) -> Path:
    """The production model's vectors of the gallery as the team exports them (item_id +
    embedding), computed with torchvision directly."""
    import torchvision
    from PIL import Image

    profile = yaml.safe_load((project / PROFILE).read_text(encoding="utf-8"))
    network = torchvision.models.resnet18(num_classes=OLD_DIM)
    network.load_state_dict(
        torch.load(project / profile["adopted"]["production"]["options"]["path"])
    )
    network.eval()
    table = project / profile["upgrades"]["mine"]["gallery"]
    images = [
        np.asarray(Image.open(table.parent / path).convert("RGB"), dtype=np.float32) / 255.0
        for path in gallery["path"]
    ]
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        vectors = network((batch - mean) / std).numpy()
    out = project / "exports" / "production_vectors.parquet"
    out.parent.mkdir(exist_ok=True)
    pd.DataFrame({"item_id": gallery["item_id"], "embedding": list(vectors)}).to_parquet(out)
    return out


def test_the_plans_commands_carry_the_upgrade_out_on_a_store_of_the_teams_vectors(
    project, monkeypatch
):
    monkeypatch.chdir(project)
    params = yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8"))
    entry, store = params["upgrades"]["mine"], params["store"]["path"]
    saved = json.loads(Path("upgrades/mine/plan/plan.json").read_text(encoding="utf-8"))
    # The worn-out production model makes the candidate worth re-embedding the gallery for.
    assert saved["recommendation"]["option"] == "reembed"
    commands = saved["next_commands"]
    assert [shlex.split(c)[1] for c in commands] == ["backfill", "backfill", "cutover"]
    # The store the commands name, holding the gallery with the production model's vectors as the
    # team exports them (item_id + embedding, looked up by id).
    gallery = pd.read_parquet(entry["gallery"])
    vectors = _production_vectors(project, gallery)
    main(
        [
            "store-ingest", "--params", "params.yaml", "--items", entry["gallery"],
            "--model", "upgrades/mine/models/old", "--vectors", str(vectors),
            "--store", store, "--score",
        ]
    )  # fmt: skip
    for command in commands:  # as the plan printed them: dry run, backfill, the cutover gate
        main(shlex.split(command)[1:])
    with GalleryStore.open(store) as opened:
        status = opened.status()
    assert status.serving_space == "new" and status.backfill.status == "complete"
    assert status.items_by_space == {"new": len(gallery)}
