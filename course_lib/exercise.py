"""Self-checking exercises: a learner fills in an answer, the next cell says whether it is right."""
from __future__ import annotations

import math


def check(name: str, answer, expected, rel_tol: float = 0.05) -> bool | None:
    """Compare a learner's answer with the expected value; None means not attempted yet (no error)."""
    if answer is None:
        print(f"{name}: not attempted yet. Replace the None above with your answer and re-run.")
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        ok = math.isclose(float(answer), float(expected), rel_tol=rel_tol)
    else:
        ok = answer == expected
    if not ok:
        raise AssertionError(f"{name}: {answer!r} is not right yet (hint: it should be close to what the lesson "
                             f"measured or computed). Try again.")
    print(f"{name}: correct.")
    return True
