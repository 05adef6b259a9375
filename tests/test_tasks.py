"""Tasks are dispatched by the datamodule's ``task``; what they measure reaches the record, the
CLI summary and the sweep objective through their metric specs, never a hard-wired bpb.
Schema-1 records (byte LM, before specs) read as schema 2.  Tables: tests/test_tables.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import json

import pytest

from conftest import TINY_RUN, compose_config
from xformer_bench import run
from xformer_bench.job import _objective, _report
from xformer_bench.registry import UnknownVariantError
from xformer_bench.results import record as records
from xformer_bench.results.collect import collect
from xformer_bench.results.metrics import metrics_of
from xformer_bench.tasks import TASK
from xformer_bench.tasks.lm import LanguageModelTask
from xformer_bench.metric_spec import BITS_PER

FIXTURES = Path(__file__).parent / "fixtures" / "records"


def _fixture(experiment: str, data: str) -> dict:
    """The first record of ``experiment`` on ``data``, read as the tables read it."""
    return next(r for r in map(records.load, sorted((FIXTURES / experiment).glob("*.json")))
                if r["choices"]["data"] == data)


def test_the_datamodule_names_the_task_the_run_builds():
    config = compose_config(*TINY_RUN)
    datamodule = run._build_datamodule(config)
    task = run._build_task(config, datamodule)
    assert "lm" in TASK.names() and datamodule.task == "lm" and datamodule.unit == "bytes"
    assert isinstance(task, LanguageModelTask) and task.metrics == (BITS_PER["bytes"],)
    assert records.task_fields(datamodule.task, task.metrics, task.unit) == {
        "task": "lm", "primary_metric": "bpb", "eval_unit": "bytes",
        "metrics": [{"name": "bpb", "title": "bpb", "higher_is_better": False, "digits": 3,
                     "scale": 1.0}]}


def test_an_unknown_task_is_one_error_line_before_the_model_is_built():
    datamodule = SimpleNamespace(task="summarise", unit="tokens", vocab_size=256)
    with pytest.raises(UnknownVariantError) as error:
        run._build_task(compose_config(*TINY_RUN), datamodule)
    assert str(error.value).startswith("unknown task 'summarise'; choose one of: ")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("experiment,data,name", [
    ("fixture_tasks", "cifar10_classify", "top1"), ("fixture_tasks", "cifar10", "bits_per_dim"),
    ("fixture_positions", "enwik8", "bpb"),  # a schema-1 record
])
def test_summary_and_sweep_objective_follow_the_primary_metric(capsys, experiment, data, name):
    record = _fixture(experiment, data) | {"record_path": "r.json"}
    assert records.primary_metric(record).name == name
    assert _objective(record) == record["final"][f"val/{name}"]
    _report(record)
    line = capsys.readouterr().out.splitlines()[0]
    assert f"final val {name} {record['final'][f'val/{name}']:.4f} | " \
           f"test {name} {record['test'][f'test/{name}']:.4f} | " in line


def test_a_record_before_its_task_was_built_has_no_objective(tmp_path):
    record = records.new_record(compose_config(), {"model": "vanilla"}, [], tmp_path)
    assert record["metrics"] == [] and records.primary_metric(record) is None
    assert _objective(record) is None


def test_a_schema_1_record_reads_as_the_byte_lm_record_schema_2_writes():
    read = _fixture("fixture_positions", "enwik8")  # records.load, as skip_completed reads
    v1 = json.loads((FIXTURES / "fixture_positions" / f"{read['run_id']}.json").read_text())
    assert read in collect(FIXTURES).records  # and as make table reads
    assert (v1["schema"], read["schema"]) == (1, 2) and "eval_bytes" not in read
    assert (read["task"], read["primary_metric"], read["eval_unit"]) == ("lm", "bpb", "bytes")
    assert read["eval_counts"] == v1["eval_bytes"] == {"val": 99999, "test": 99999}
    assert [(m.title, m.test_key, m.spec.higher_is_better) for m in metrics_of(read)] == \
        [("enwik8 bpb", "test/bpb", False)]
    assert {k: v for k, v in read.items() if k not in ("schema", *records.TASK_KEYS,
                                                      "eval_counts", "choices")} == \
        {k: v for k, v in v1.items() if k not in ("schema", "eval_bytes", "choices")}
    assert read["choices"] == {**v1["choices"], **records.GROUPS_ADDED}  # groups added since


def test_a_record_from_before_a_group_existed_reads_with_the_option_it_ran():
    old = {"schema": 2, "choices": {"model": "vanilla", "attention": "full"}}
    assert records.upgrade(old)["choices"] == {"model": "vanilla", "attention": "full",
                                               "stack": "standard", "embedding": "lookup",
                                               "head": "softmax"}
    assert old["choices"] == {"model": "vanilla", "attention": "full"}  # not modified
    newer = {"schema": 2, "choices": {"attention": "full", "stack": "reversible"}}
    assert records.upgrade(newer)["choices"]["stack"] == "reversible"


def test_a_record_with_a_malformed_metric_spec_is_skipped(tmp_path):
    record = json.loads(next((FIXTURES / "fixture_tasks").glob("*.json")).read_text())
    record["metrics"] = [{"title": "no name"}]
    (tmp_path / "bad.json").write_text(json.dumps(record))
    [skipped] = collect(tmp_path).skipped
    assert "metric spec" in skipped.reason
