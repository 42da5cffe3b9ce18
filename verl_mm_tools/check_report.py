"""What a contract check (``check_tool``, ``check_environment``) checked, to print."""

from __future__ import annotations


class CheckReport:
    """The checks a subject passed, in order; ``str()`` lists them."""

    def __init__(self, subject: str):
        self.subject = subject
        self.checks: list[str] = []

    def passed(self, check: str) -> None:
        self.checks.append(check)

    def __str__(self) -> str:
        lines = "".join(f"\n  ok  {check}" for check in self.checks)
        return f"{self.subject}: {len(self.checks)} checks passed{lines}"
