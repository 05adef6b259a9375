"""What ``skip_completed`` and claims may trust: a record is this run's only when its
own run id, and the id its own config hashes to, are the path's; a claim says who holds it, since
when, and how to clear it."""

from __future__ import annotations

import json
import socket

from conftest import compose_config
from xformer_bench.config import choice_groups
from xformer_bench.results.record import (finished_record, new_record, results_path,
                                          run_identity, write_json_atomic)
from xformer_bench.run_claim import claim_line, claim_path, claimed


def _config(tmp_path, seed: int) -> tuple[dict, dict]:
    config = compose_config("experiment=smoke", f"seed={seed}",
                            f"paths.results_dir={tmp_path / 'results'}")
    return config, {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}


def _finished(config: dict, choices: dict) -> dict:
    record = new_record(config, choices, [], config["paths"]["results_dir"])
    return {**record, "status": "finished"}


def test_a_finished_record_at_its_own_path_is_trusted(tmp_path):
    config, choices = _config(tmp_path, 0)
    path = results_path(config, run_identity(config, choices))
    write_json_atomic(path, _finished(config, choices))
    assert finished_record(config, choices)["run_id"] == path.stem


def test_another_seeds_record_copied_to_this_path_is_not_trusted(tmp_path, capsys):
    config, choices = _config(tmp_path, 0)
    other, other_choices = _config(tmp_path, 1)
    path = results_path(config, run_identity(config, choices))
    write_json_atomic(path, _finished(other, other_choices))  # seed 1's result at seed 0's path
    assert finished_record(config, choices) is None
    assert "not trusted" in capsys.readouterr().out
    forged = {**_finished(other, other_choices), "run_id": path.stem}  # its id edited too
    write_json_atomic(path, forged)
    assert finished_record(config, choices) is None  # its config hashes to seed 1's id


def test_a_record_file_that_is_not_an_object_is_one_line_not_a_traceback(tmp_path, capsys):
    config, choices = _config(tmp_path, 0)
    path = results_path(config, run_identity(config, choices))
    path.parent.mkdir(parents=True)
    for payload in ("[1, 2]", "{not json", '"finished"'):
        path.write_text(payload)
        assert finished_record(config, choices) is None
        assert capsys.readouterr().out.count("not trusted") == 1


def test_a_claim_from_another_host_is_respected_and_named_with_the_command_to_clear_it(tmp_path):
    record = tmp_path / "exp" / "run.json"
    record.parent.mkdir()
    claim_path(record).write_text("node-17 4242 2026-11-20T03:00:00+00:00\n")
    with claimed(record) as owned:
        assert not owned  # another host's process cannot be checked from here
    line = claim_line(record)
    assert "pid 4242 on node-17 since 2026-11-20T03:00:00+00:00" in line
    assert line.endswith(f"rm {claim_path(record)}")


def test_a_claim_records_host_pid_and_start_time(tmp_path):
    record = tmp_path / "exp" / "run.json"
    with claimed(record) as owned:
        host, pid, since = claim_path(record).read_text().split()
        assert owned and host == socket.gethostname() and int(pid) > 0 and since[:2] == "20"
        assert "this host" in claim_line(record)
