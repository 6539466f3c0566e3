"""The prepare and split stages end to end on a tiny IDX dataset; bad input exits cleanly."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from stages import prepare, split
from tests.data_fixtures import make_params, write_idx_dataset, write_params_yaml


@pytest.fixture
def project(tmp_path):
    write_idx_dataset(tmp_path / "idx", train=40, test=16, classes=4)
    params_path = write_params_yaml(tmp_path / "params.yaml", make_params(tmp_path / "idx"))
    return tmp_path, params_path


def test_prepare_then_split_every_scenario_deterministically(project):
    tmp, params_path = project
    manifest_path = tmp / "data" / "manifests" / "tiny.parquet"
    prepare.main(["--params", str(params_path), "--out", str(manifest_path)])
    assert len(pd.read_parquet(manifest_path)) == 56
    for kind in ("extended-data", "open-data", "extended-class", "open-class", "identical-data"):
        for attempt in ("a", "b"):
            split.main(
                [
                    "--params",
                    str(params_path),
                    "--manifest",
                    str(manifest_path),
                    "--scenario",
                    kind,
                    "--out",
                    str(tmp / attempt / kind),
                ]
            )
        files = sorted(p.name for p in (tmp / "a" / kind).iterdir())
        assert files == [
            "gallery.parquet",
            "new_train.parquet",
            "old_train.parquet",
            "query.parquet",
            "split_info.json",
        ]
        for name in files:
            assert (tmp / "a" / kind / name).read_bytes() == (tmp / "b" / kind / name).read_bytes()
    split.main(
        [
            "--params",
            str(params_path),
            "--manifest",
            str(manifest_path),
            "--sequential",
            "--out",
            str(tmp / "sequential"),
        ]
    )
    info = json.loads((tmp / "sequential" / "split_info.json").read_text())
    assert [info["sizes"][f"gen{i}"]["images"] for i in range(3)] == [8, 20, 40]


def test_unknown_scenario_and_missing_manifest_exit_non_zero(project, capsys):
    tmp, params_path = project
    with pytest.raises(SystemExit) as exit_info:
        split.main(
            [
                "--params",
                str(params_path),
                "--manifest",
                str(tmp / "none.parquet"),
                "--scenario",
                "extended-data",
                "--out",
                str(tmp / "x"),
            ]
        )
    assert exit_info.value.code == 2 and "run the prepare stage first" in capsys.readouterr().err
    prepare.main(["--params", str(params_path), "--out", str(tmp / "m.parquet")])
    with pytest.raises(SystemExit):
        split.main(
            [
                "--params",
                str(params_path),
                "--manifest",
                str(tmp / "m.parquet"),
                "--scenario",
                "sideways-data",
                "--out",
                str(tmp / "x"),
            ]
        )
    assert "unknown scenario 'sideways-data'" in capsys.readouterr().err
    assert not (tmp / "x").exists()


def test_missing_dataset_exits_with_install_hint(tmp_path, capsys):
    params_path = write_params_yaml(tmp_path / "params.yaml", make_params(tmp_path / "nowhere"))
    with pytest.raises(SystemExit):
        prepare.main(["--params", str(params_path), "--out", str(tmp_path / "m.parquet")])
    assert "make dataset" in capsys.readouterr().err
