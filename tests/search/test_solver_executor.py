"""The planner's shared machinery: PuLP solves with status by name and constraints re-checked in
plain Python; executors that return the same results in the same order whatever runs them."""

import pulp
import pytest

from search.executor import batches, map_batches
from search.run import run_search
from search.solver import available_solver, check_constraints, solve
from sim.errors import ConfigError


def _knapsack(capacity: float) -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable]]:
    # values 6, 10, 12 with weights 1, 2, 3: capacity 5 -> take items b and c (value 22)
    problem = pulp.LpProblem("knapsack", pulp.LpMaximize)
    take = {name: problem.add_variable(f"take_{name}", cat="Binary") for name in "abc"}
    problem += 6 * take["a"] + 10 * take["b"] + 12 * take["c"]
    problem += (1 * take["a"] + 2 * take["b"] + 3 * take["c"] <= capacity, "weight_within_capacity")
    problem += (take["a"] + take["b"] + take["c"] >= 1, "take_something")
    return problem, take


@pytest.mark.parametrize("solver", ["HiGHS", available_solver(("COIN_CMD", "PULP_CBC_CMD"))])
def test_milp_known_optimum_on_both_solvers(solver):
    problem, take = _knapsack(5)
    solution = solve(problem, solver=solver)
    assert solution.optimal and solution.solver == solver
    assert solution.objective == pytest.approx(22)
    assert [round(solution.value(take[n])) for n in "abc"] == [0, 1, 1]
    assert check_constraints(problem, solution) == []


def test_infeasible_is_a_result_and_violations_are_named():
    problem, _ = _knapsack(5)
    problem += (pulp.lpSum(problem.variables()) >= 4, "take_four_of_three")
    assert solve(problem).status == "Infeasible"
    feasible, take = _knapsack(5)
    solution = solve(feasible)
    tighter, _ = _knapsack(4)  # the capacity-5 optimum weighs 5: breaks a capacity of 4
    assert check_constraints(tighter, solution) == ["weight_within_capacity"]


def _square_all(batch):
    return [x * x for x in batch]


def test_executors_agree_in_order():
    work = batches(list(range(23)), 5)
    assert [len(b) for b in work] == [5, 5, 5, 5, 3]
    seen = []
    serial = map_batches(_square_all, work, workers=1, on_done=seen.append)
    pooled = map_batches(_square_all, work, workers=2)
    assert serial == pooled == [[x * x for x in b] for b in work]
    assert sum(seen) == 23


def test_unknown_goal_names_the_choices():
    with pytest.raises(ConfigError, match=r"\[search\] goal = 'plans' must be one of training, fleet, offload"):
        run_search({"search": {"goal": "plans"}}, None)


def test_every_goal_names_a_planner_that_exists():
    import importlib

    from search.run import PLANNERS

    for target in PLANNERS.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
