"""params.yaml's plugin references checked against the registries (``modelupgrade.params``), and
a bad params file reported like any user error by the front ends."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from modelupgrade.cli.arguments import run_command
from modelupgrade.commands.data import prepare
from modelupgrade.config import HeadParams, HeadTraining, ParamsError, parse_params, read_params
from modelupgrade.data.loaders import LOADERS
from modelupgrade.errors import UserError
from modelupgrade.heads import HEADS
from modelupgrade.layers import CLASSIFIERS
from modelupgrade.params import check_params, load_params
from modelupgrade.retrieval.index import INDEXES

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = {"scenarios": {}, "architectures": {}, "strategies": {}, "sequential": {"strategies": []}}


def problems_of(raw: dict) -> list[str]:
    with pytest.raises(ParamsError) as err:
        check_params(parse_params(raw))
    return [line.removeprefix("  - ") for line in str(err.value).splitlines()[1:-1]]


def test_the_project_params_pass() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params == read_params(ROOT / "params.yaml")


def test_every_bad_plugin_reference_is_reported_under_its_key() -> None:
    raw = {
        **MINIMAL,
        "strategies": {"b": {"kind": "bct", "options": {"weigth": 1}}, "x": {"kind": "bogus"}},
        "heads": {
            "r": {"kind": "rqt", "options": {"distance": "manhattan"}},
            "h": {"kind": "nope"},
        },
        "backfill": {"policies": ["random", "fastest"], "serving_modes": ["mixed", "blended"]},
        "store": {"policy": "sideways", "serving_mode": "merged"},
    }
    problems = problems_of(raw)
    assert len(problems) == 8
    keys = [problem.split(": ")[0] for problem in problems]
    assert keys == [
        "strategies.b.options.weigth",
        "strategies.x.kind",
        "heads.r.options.distance",
        "heads.h.kind",
        "backfill.policies",
        "backfill.serving_modes",
        "store.policy",
        "store.serving_mode",
    ]
    assert "unknown key" in problems[0] and "options of strategy kind 'bct'" in problems[0]
    assert "unknown strategy 'bogus' (choose one of: " in problems[1]
    assert "options of head kind 'rqt'" in problems[2]
    assert "unknown backfill ordering policy 'fastest'" in problems[4]
    assert "unknown serving mode 'blended'" in problems[5]
    assert "unknown backfill ordering policy 'sideways'" in problems[6]
    assert "unknown serving mode 'merged'" in problems[7]


def test_loaders_classifiers_and_search_indexes_are_checked_against_their_registries() -> None:
    raw = {
        **MINIMAL,
        "dataset": {"loader": "tfrecord"},
        "architectures": {"a": {"backbone": "resnet10t", "classifier": "sphereface"}},
        "evaluation": {"search": {"index": "lsh"}},
    }
    assert problems_of(raw) == [
        "dataset.loader: unknown dataset loader 'tfrecord' (choose one of: "
        + ", ".join(LOADERS.names())
        + ")",
        "architectures.a.classifier: unknown classifier 'sphereface' (choose one of: "
        + ", ".join(CLASSIFIERS.names())
        + ")",
        "evaluation.search.index: unknown search index 'lsh' (choose one of: "
        + ", ".join(INDEXES.names())
        + ")",
    ]
    assert set(LOADERS.names()) >= {"idx", "imagefolder", "manifest", "cifar100", "gldv2"}
    assert set(CLASSIFIERS.names()) == {"softmax", "arcface", "cosface"}
    assert set(INDEXES.names()) == {"flat", "ivf", "hnsw"}


def test_the_store_policy_must_be_deployable() -> None:
    (problem,) = problems_of({**MINIMAL, "store": {"policy": "oracle"}})
    assert problem.startswith("store.policy: backfill ordering policy 'oracle' is not deployable")
    offered = problem.split("choose one of: ")[1]
    assert "old-confidence" in offered and "oracle" not in offered
    check_params(parse_params({**MINIMAL, "store": {"policy": "ingest-order"}}))


def test_head_entries_override_the_fields_of_head_training() -> None:
    # One definition: every HeadTraining field is an optional override of a params entry, with
    # HeadTraining's own checks.
    assert set(HeadTraining.model_fields) <= set(HeadParams.model_fields)
    entry = HeadParams(kind="bict")
    assert all(getattr(entry, name) is None for name in HeadTraining.model_fields)
    assert entry.training_overrides() == {}
    with pytest.raises(ParamsError, match=r"heads\.b\.batch_size: .*greater than or equal to 2"):
        parse_params({**MINIMAL, "heads": {"b": {"kind": "bict", "batch_size": 1}}})
    assert isinstance(HEADS.get("bict").TRAINING_DEFAULTS, HeadTraining)


def test_a_bad_params_file_exits_2_with_one_error_line(tmp_path: Path, capsys) -> None:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["store"]["serving_mode"] = "merged"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))

    # What a stage or `modelupgrade` command does with it (``run_command`` reads the params).
    argv = ["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "m.parquet")]
    with pytest.raises(SystemExit) as exit_info:
        run_command(prepare, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'params.yaml'} is not valid (1 problem(s)):")
    assert "store.serving_mode: unknown serving mode 'merged'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("error", "retried"),
    [(ParamsError("bad params"), False), (UserError("bad input"), False), (OSError("busy"), True)],
)
def test_the_flows_never_retry_bad_input(error: Exception, retried: bool) -> None:
    from modelupgrade.orchestration import retry_unless_user_error

    def result() -> None:
        raise error

    assert retry_unless_user_error(None, None, SimpleNamespace(result=result)) is retried
