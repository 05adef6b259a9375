"""``--dry-run``'s planner (:class:`xformer_bench.sweep_plan.JobPlanner`): jobs that differ only
in the seed share one composition and one parameter match, and each still gets what a job of its
own would (its seed, an interpolated ``${seed}``, its run id)."""

from __future__ import annotations

from xformer_bench.sweep_plan import JobPlanner

STUDY = ["experiment=modern_mixers", "attention=retnet", "model.n_layers=1"]


def test_seeds_share_one_composition_and_one_match_yet_plan_as_alone():
    shared = JobPlanner()
    plans = [shared.plan([*STUDY, f"seed={seed}"]) for seed in (0, 1, 2)]
    assert len(shared._composed) == 1 and len(shared._matched) == 1  # noqa: SLF001
    alone = [JobPlanner().plan([*STUDY, f"seed={seed}"]) for seed in (0, 2)]
    assert [p[:2] for p in alone] == [plans[0][:2], plans[2][:2]]
    assert alone[1][2] == plans[2][2]  # the whole config, parameter match included
    assert [p[2]["seed"] for p in plans] == [0, 1, 2] and len({p[0] for p in plans}) == 3
    assert plans[1][2]["match_params"]["result"]["status"] == "matched"


def test_an_interpolated_seed_follows_each_job_and_so_does_its_match():
    planner = JobPlanner()
    plans = [planner.plan([*STUDY, "experiment_name=seed_${seed}", f"seed={seed}"])
             for seed in (0, 1)]
    assert [p[2]["experiment_name"] for p in plans] == ["seed_0", "seed_1"]
    assert len(planner._composed) == 1 and len(planner._matched) == 2  # noqa: SLF001


def test_a_job_that_changes_more_than_the_seed_is_composed_and_matched_again():
    planner = JobPlanner()
    wide, narrow = (planner.plan([*STUDY, f"model.d_model={d}", "seed=0"]) for d in (64, 32))
    assert len(planner._composed) == 2 and len(planner._matched) == 2  # noqa: SLF001
    assert wide[2]["match_params"]["result"]["reference_params"] != \
        narrow[2]["match_params"]["result"]["reference_params"]
