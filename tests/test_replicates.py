"""The replicates: the study's claims again at further training seeds (params.yaml replicates).

A replicate must be the study at another seed, not an approximation of it: at the study's own seed
it reproduces what the train, train_heads and evaluate commands (the DVC stages) measure, number
for number. Its params are the study's cut down to what ``replicates.scenarios`` lists, and a
mistaken replicates section is refused when params.yaml is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelupgrade.config import ParamsError, parse_params
from modelupgrade.layout import StudyLayout
from modelupgrade.replicates import replicate_params, run_replicate, run_replicates
from tests.data_fixtures import write_toy_splits
from tests.model_fixtures import resnet10t, toy_scenario_params

SEED = 3


def params_with(replicates: dict[str, Any], **sections: Any) -> Any:
    return toy_scenario_params(
        "default",
        resnet10t(),
        {},
        {"epochs": 1, "batch_size": 16},
        strategies={"bct": {"kind": "bct"}, "independent": {"kind": "independent"}},
        scenarios={
            "toy": {
                "kind": "extended-data",
                "strategies": ["independent", "bct"],
                "heads": {"fct": "independent"},
            }
        },
        heads={"fct": {"kind": "fct", "hidden_dim": 8, "epochs": 1}},
        evaluation={"topk": [1], "tar_at_far": [0.1]},
        replicates=replicates,
        **sections,
    )


# -- the replicates section ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicates", "message"),
    [
        ({"seeds": [SEED + 50], "scenarios": {"toy": {"strategies": ["bct"]}}}, "within 100"),
        ({"seeds": [SEED], "scenarios": {"toy": {"strategies": ["bct"]}}}, "own seed 3"),
        ({"seeds": [500, 520], "scenarios": {"toy": {"strategies": ["bct"]}}}, "within 100"),
        ({"seeds": [500, 500], "scenarios": {"toy": {"strategies": ["bct"]}}}, "repeats a seed"),
        ({"seeds": [500]}, "lists nothing to train again"),
        ({"scenarios": {"other": {"strategies": ["bct"]}}}, "scenario 'other'"),
        ({"scenarios": {"toy": {"strategies": ["dmu"]}}}, "strategy 'dmu'"),
        ({"scenarios": {"toy": {"strategies": ["bct"], "heads": ["rqt"]}}}, "head 'rqt'"),
        (
            {"scenarios": {"toy": {"strategies": ["bct"], "heads": ["fct"]}}},
            "pairs with strategy 'independent'",
        ),
        ({"scenarios": {"toy": {"strategies": []}}}, "strategies"),
        ({"seeds": [500], "extra": 1, "scenarios": {"toy": {"strategies": ["bct"]}}}, "extra"),
        ({"policies": ["oracle", "nonsense"]}, r"replicates.policies lists \['nonsense'\]"),
        ({"serving_modes": ["rank-merge-rqt", "x"]}, r"serving_modes lists \['x'\]"),
    ],
)
def test_a_mistaken_replicates_section_is_refused_with_what_is_wrong(
    replicates: dict[str, Any], message: str
) -> None:
    with pytest.raises(ParamsError, match=message):
        params_with(replicates)


def test_a_replicates_params_are_the_studys_cut_down_at_its_seed() -> None:
    params = params_with(
        {"seeds": [500], "scenarios": {"toy": {"strategies": ["independent"], "heads": ["fct"]}}},
        adapters={"scenarios": {"toy": "bct"}, "heads": {"procrustes": {"kind": "procrustes"}}},
    )
    assert replicate_params(params, 500).backfill == params.backfill
    params = params_with({**params.replicates.model_dump(), "policies": ["random"]})
    seeded = replicate_params(params, 500, cpu_threads=1)
    assert seeded.seed == 500
    assert seeded.scenarios["toy"].strategies == ["independent"]
    assert seeded.scenarios["toy"].heads == {"fct": "independent"}
    assert seeded.adapters.scenarios == {}  # its strategy, bct, is not replicated
    assert seeded.replicates.seeds == []
    assert seeded.training.cpu_threads == 1
    assert seeded.backfill.policies == ["random"]
    assert seeded.backfill.serving_modes == params.backfill.serving_modes
    # Everything else is the study's.
    assert seeded.training.epochs == params.training.epochs
    assert seeded.evaluation == params.evaluation
    assert parse_params(seeded.model_dump()) == seeded


def test_without_seeds_nothing_runs_and_stale_results_go(tmp_path: Path) -> None:
    stale = tmp_path / "seed-500" / "metrics"
    stale.mkdir(parents=True)
    written = run_replicates(params_with({}), tmp_path)
    assert written == [tmp_path / "seeds.json"]
    assert json.loads(written[0].read_text()) == {"results": [], "seeds": []}
    assert not (tmp_path / "seed-500").exists()


# -- a replicate is the study at its seed ----------------------------------------------------------


def summary_numbers(path: Path) -> dict[str, Any]:
    """An evaluation summary's numbers, and the sha256 of every embedding file it read (the paths
    differ between the study and a replicate; the bytes must not)."""
    summary = json.loads(path.read_text(encoding="utf-8"))
    return {
        "old_self": summary["old_self"],
        "oracle_self": summary["oracle_self"],
        "strategies": summary["strategies"],
        "embeddings": {
            # A head's card names its paths and the time it was made: only the arrays compare.
            name: {
                split: entry["sha256"]
                for split, entry in files.items()
                if "sha256" in entry and split != "card"
            }
            for name, files in summary["sources"].items()
            if isinstance(files, dict)
        },
    }


def test_a_replicate_at_the_studys_seed_measures_what_the_stages_measure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelupgrade.commands.evaluation import evaluate
    from modelupgrade.commands.heads import train_heads
    from modelupgrade.commands.training import train

    monkeypatch.chdir(tmp_path)
    splits = write_toy_splits(tmp_path, monkeypatch).parent
    params = params_with(
        {"scenarios": {"toy": {"strategies": ["independent", "bct"], "heads": ["fct"]}}}
    )
    # The stages, as dvc.yaml runs them.
    layout = StudyLayout()
    embed_splits = [splits / "toy" / f"{name}.parquet" for name in ("query", "gallery")]
    embed_splits.append(splits / "toy" / "new_train.parquet")
    for strategy in (None, "independent", "bct"):
        generation = 0 if strategy is None else 1
        name = "gen0" if strategy is None else f"gen1-{strategy}"
        train(
            params,
            scenario="toy",
            generation=generation,
            strategy=strategy,
            progress=False,
            embed_split=embed_splits,
            embed_dir=layout.embeddings("toy", name),
            embed_logits=strategy is None,
        )
    train_heads(
        params,
        "fct",
        old_embeddings=Path("embeddings/toy/gen0/new_train.npy"),
        new_embeddings=Path("embeddings/toy/gen1-independent/new_train.npy"),
        labels=splits / "toy" / "new_train.parquet",
        out=Path("heads/toy/fct-independent"),
        new_model=Path("models/toy/gen1-independent"),
        old_model=Path("models/toy/gen0"),
        outputs_dir=Path("embeddings/toy/fct-independent"),
        evaluation_old=Path("embeddings/toy/gen0"),
        evaluation_new=Path("embeddings/toy/gen1-independent"),
    )
    evaluate(params, "toy")
    stages = summary_numbers(Path("metrics/toy/summary.json"))

    done = run_replicate(params, SEED, tmp_path / "replicates", splits)
    assert done == tmp_path / "replicates" / f"seed-{SEED}"
    replicate = summary_numbers(done / "metrics" / "toy" / "summary.json")
    assert replicate == stages
    heads = [r for r in replicate["strategies"]["independent"] if r["comparison"] == "forward-head"]
    assert [r["gallery_set"] for r in heads] == ["fct-independent(gen0)"]  # the head's M compared
    # Only the results are kept; the scratch models, embeddings and heads are gone.
    assert sorted(p.name for p in (tmp_path / "replicates").iterdir()) == [f"seed-{SEED}"]
    assert sorted(p.name for p in done.iterdir()) == ["metrics"]
    # Another seed trains other models.
    other = run_replicate(params, SEED + 100, tmp_path / "replicates", splits)
    assert summary_numbers(other / "metrics" / "toy" / "summary.json") != stages
