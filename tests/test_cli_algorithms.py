"""Every registered algorithm is reachable from the CLI with its options
(``--algorithm NAME --option key=value``), and the options land in plan.json."""
import dataclasses
import json

import pytest

from partitioner.registry import REGISTRY
from profiles import CLUSTERS_DIR
from tfpart.cli import main

# One option per algorithm, set away from its default where it has any.
OPTIONS = {"greedy": ["refine_evaluations=5"], "ilp": ["time_limit=5", "max_units=8"],
           "single": [], "random": ["seed=7"], "round_robin": [], "m_topo": [], "m_etf": [],
           "min_cut": ["passes=2"], "topo_split": [], "pipeline": ["microbatches=2"],
           "data_parallel": ["replicas=2"], "filter_split": ["candidates=3"], "hybrid": ["groups=2"]}
# Replicas of a placement need groups of two devices or more: four devices.
CLUSTERS = {"hybrid": str(CLUSTERS_DIR / "4xT4_one_host.json")}


def test_every_registered_algorithm_has_a_case():
    assert set(OPTIONS) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_algorithm_and_options_from_the_cli(name, capsys, tmp_path):
    argv = ["compile", "--algorithm", name, "--batch-size", "4", "-o", str(tmp_path / "out")]
    if name in CLUSTERS:
        argv += ["--cluster", CLUSTERS[name]]
    for option in OPTIONS[name]:
        argv += ["--option", option]
    assert main(argv) == 0, capsys.readouterr().err
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["algorithm"] == name
    defaults = dataclasses.asdict(REGISTRY[name].options())
    for option in OPTIONS[name]:
        key, value = option.split("=")
        assert str(plan["options"][key]) in (value, str(float(value)))
        assert plan["options"][key] != defaults[key]
    if REGISTRY[name].stages:
        assert plan["stages"]["microbatches"] == 2 and plan["stages"]["of"]


@pytest.mark.parametrize("option,words", [("nonsense=1", "has no 'nonsense'"),
                                          ("seed=three", "not an int"),
                                          ("seed", "expected key=value")])
def test_bad_options_are_one_line_errors(option, words, capsys, tmp_path):
    code = main(["compile", "--algorithm", "random", "--option", option, "-o",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err
    assert not (tmp_path / "out").exists()


def test_seeds_set_from_the_cli_change_a_random_placement(capsys, tmp_path):
    plans = []
    for seed in (1, 2):
        out = tmp_path / f"out{seed}"
        assert main(["compile", "--algorithm", "random", "--option", f"seed={seed}",
                     "--batch-size", "2", "-o", str(out)]) == 0
        plans.append(json.loads((out / "plan.json").read_text())["assignment"])
    assert plans[0] != plans[1]


def test_auto_strategy_keeps_the_least_predicted_step_and_says_why(capsys, tmp_path):
    assert main(["compile", "--batch-size", "8", "-o", str(tmp_path / "auto")]) == 0
    out = capsys.readouterr().out
    plan = json.loads((tmp_path / "auto" / "plan.json").read_text())
    strategy = plan["context"]["strategy"]
    assert set(strategy["step_times"]) | set(strategy["refused"]) == \
        {"greedy", "pipeline", "data_parallel", "filter_split", "hybrid"}
    assert strategy["chosen"] == min(strategy["step_times"], key=strategy["step_times"].get)
    assert plan["predicted"]["step_time"] == strategy["step_times"][strategy["chosen"]]
    assert f"Strategy {strategy['chosen']}: the least predicted step" in out


@pytest.mark.parametrize("strategy, algorithm", [("placement", "greedy"),
                                                 ("pipeline", "pipeline"),
                                                 ("data_parallel", "data_parallel"),
                                                 ("filter_split", "filter_split")])
def test_a_forced_strategy_is_the_plan(strategy, algorithm, capsys, tmp_path):
    assert main(["compile", "--batch-size", "8", "--strategy", strategy, "-o",
                 str(tmp_path / "out")]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["algorithm"] == algorithm and "strategy" not in plan["context"]
    assert (plan["replicas"] is not None) == (strategy == "data_parallel")
    assert bool(plan.get("splits")) == (strategy == "filter_split")
    if strategy == "filter_split":
        assert "Filter split: " in capsys.readouterr().out


@pytest.mark.parametrize("flags, words", [
    (["--strategy", "hybrid", "--microbatches", "2"], "--strategy hybrid and a pipeline flag"),
    (["--strategy", "auto", "--algorithm", "ilp"], "--strategy auto plans every strategy"),
    (["--strategy", "auto", "--option", "seed=1"], "--strategy auto plans every strategy"),
    (["--pipeline", "--algorithm", "greedy"], "--algorithm greedy and a pipeline ask"),
    (["--algorithm", "greedy", "--microbatches", "2"],  # what it takes, from its declaration
     "ask for two strategies: greedy takes its options (GreedyOptions); no micro-batches"),
    (["--schedule", "gpipe", "--algorithm", "min_cut"], "min_cut takes its options"),
    (["--strategy", "data_parallel", "--algorithm", "ilp"],
     "--algorithm ilp and --strategy data_parallel ask"),
    (["--pipeline", "--option", "batch_size=3", "--batch-size", "4"],
     "--option batch_size=3: the batch size is the model's (4"),
])
def test_flags_that_ask_for_two_things_are_refused(flags, words, capsys, tmp_path):
    """Before, the pipeline flags won over --strategy, --strategy over --algorithm, and a
    pipeline's batch size overwrote --option batch_size=, all without a word."""
    code = main(["compile", *flags, "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags", [["--pipeline"], ["--strategy", "pipeline"],
                                   ["--algorithm", "pipeline"], ["--schedule", "gpipe"]])
def test_every_way_of_asking_for_a_pipeline_is_one(flags, capsys, tmp_path):
    assert main(["compile", *flags, "--batch-size", "4", "-o", str(tmp_path / "out")]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["algorithm"] == "pipeline" and plan["stages"]["of"]


def test_a_schedule_asked_of_an_inference_step_is_said_to_be_gpipe(capsys, tmp_path):
    assert main(["compile", "--schedule", "1f1b", "--batch-size", "4",
                 "-o", str(tmp_path / "out")]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["stages"]["of"] and not plan["stages"].get("schedule")
    out = capsys.readouterr().out
    assert "--schedule 1f1b: the signature has no backward pass" in out, out
