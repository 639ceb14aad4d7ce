"""Solving PuLP models: HiGHS (through highspy) first, CBC as the fallback, status checked by name.

Models use PuLP 3's API (``problem.add_variable``, ``problem.constraints()``). Every MILP/LP of the planner is built in its own function with named constraints and handed to
``solve``; the caller then checks the returned values against its constraints in plain Python
(``check_constraints``) before using them, as DESIGN.md asks.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from typing import Mapping

import pulp

# Solvers in order of preference; the first one available is used.
SOLVER_NAMES = ("HiGHS", "COIN_CMD", "PULP_CBC_CMD")
# Statuses of ``pulp.LpStatus`` (by name) that carry a usable solution.
OPTIMAL = "Optimal"


class SolverError(Exception):
    """No solver is available, or a solver returned a status other than Optimal/Infeasible."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Solution:
    """The outcome of one solve: the status by name, the solver used, the objective and every
    variable's value by name (empty unless the status is Optimal)."""

    status: str
    solver: str
    objective: float | None
    values: Mapping[str, float]

    @property
    def optimal(self) -> bool:
        return self.status == OPTIMAL

    def value(self, variable: pulp.LpVariable) -> float:
        return self.values[variable.name]


def available_solver(preferred: tuple[str, ...] = SOLVER_NAMES) -> str:
    """The first solver of ``preferred`` that PuLP can run here."""
    available = set(pulp.listSolvers(onlyAvailable=True))
    for name in preferred:
        if name in available:
            return name
    raise SolverError(f"none of the solvers {', '.join(preferred)} is available (install highspy)")


def solve(problem: pulp.LpProblem, *, solver: str | None = None, time_limit_s: float | None = None) -> Solution:
    """Solve ``problem`` quietly with HiGHS (or ``solver``); Optimal and Infeasible are results,
    any other status (Not Solved, Unbounded, Undefined) raises ``SolverError`` naming it."""
    name = solver or available_solver()
    options: dict[str, object] = {"msg": False}
    if time_limit_s is not None:
        options["timeLimit"] = time_limit_s
    with warnings.catch_warnings(), _native_stdout_silenced():  # PuLP 3 deprecates its bundled CBC
        warnings.simplefilter("ignore", DeprecationWarning)
        problem.solve(pulp.getSolver(name, **options))
    status = pulp.LpStatus[problem.status]
    if status == OPTIMAL:
        values = {v.name: float(v.varValue) for v in problem.variables() if v.varValue is not None}
        return Solution(status=status, solver=name, objective=float(pulp.value(problem.objective)), values=values)
    if status == "Infeasible":
        return Solution(status=status, solver=name, objective=None, values={})
    raise SolverError(f"{name} returned status '{status}' for problem '{problem.name}'")


@contextmanager
def _native_stdout_silenced() -> Iterator[None]:
    """File descriptor 1 pointed at /dev/null: highspy prints its banner from C++ on every ``Highs()``
    PuLP constructs, whatever ``msg`` says, and stdout must stay clean for ``--format json``."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def expression_value(expression: pulp.LpAffineExpression, solution: Solution) -> float:
    """An affine expression of the model evaluated on the solution's values (absent variables: 0)."""
    return sum(coef * solution.values.get(var.name, 0.0) for var, coef in expression.items()) + expression.constant


def check_constraints(problem: pulp.LpProblem, solution: Solution, tolerance: float = 1e-6) -> list[str]:
    """Names of the constraints of ``problem`` that ``solution`` violates by more than
    ``tolerance`` (relative to the constraint's constant, at least absolute ``tolerance``), evaluated
    in plain Python from the solution's values, not from the solver's state."""
    violated = []
    for constraint in problem.constraints():
        lhs = expression_value(constraint, solution)
        slack = tolerance * max(1.0, abs(constraint.constant))
        sense = constraint.sense
        if (sense == pulp.LpConstraintLE and lhs > slack) or (sense == pulp.LpConstraintGE and lhs < -slack) or (
            sense == pulp.LpConstraintEQ and abs(lhs) > slack
        ):
            violated.append(constraint.name)
    return violated


def solve_checked(problem: pulp.LpProblem, *, tolerance: float = 1e-6) -> Solution | None:
    """``solve`` then ``check_constraints``: the optimum, re-verified in plain Python, or None when the
    model is infeasible; a solution that breaks a constraint raises AssertionError naming it."""
    solution = solve(problem)
    if not solution.optimal:
        return None
    violated = check_constraints(problem, solution, tolerance=tolerance)
    if violated:
        raise AssertionError(f"{problem.name}: the solver's solution violates {', '.join(violated)}")
    return solution
