from __future__ import annotations

import pytest

from tridentflow.faults import Fault, FaultPlan, FaultSpecError, InjectedFaultError


def test_parse_the_documented_syntax():
    plan = FaultPlan.parse("mid-commit@2=kill, in-emit@3#2 ,dark:3@2-4,dark:1@7")
    assert plan.faults == (Fault("mid-commit", 2, 1, "kill"), Fault("in-emit", 3, 2, "raise"))
    assert plan.dark_partitions(3) == {3}
    assert plan.dark_partitions(7) == {1}
    assert plan.dark_partitions(5) == set()


@pytest.mark.parametrize(
    "bad", ["explode@1", "mid-commit", "mid-commit@x", "in-emit@1=crash", "dark:a@1", "dark:1@5-2"]
)
def test_bad_specs_name_the_problem(bad):
    with pytest.raises(FaultSpecError, match="fault"):
        FaultPlan.parse(bad)


def test_a_fault_fires_only_on_its_attempt():
    plan = FaultPlan.parse("before-ledger@4#2")
    plan.fire("before-ledger", 4, 1)
    plan.fire("mid-commit", 4, 2)
    with pytest.raises(InjectedFaultError, match="before-ledger@4#2"):
        plan.fire("before-ledger", 4, 2)
