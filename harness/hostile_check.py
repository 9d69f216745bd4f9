"""Judging answers to hostile cases: no 5xx, nothing wrongly accepted, each the status and code it must be."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from harness.hostile import Case
from harness.http_transport import Answer

__all__ = ["NO_ANSWER", "Report", "run_cases", "status_label", "verdict"]

#: How a real HTTP server refuses a request before the app sees it (not with our JSON): a bad header
#: (400), a request line or header too long (414, 431).
_SERVER_STATUSES = frozenset({400, 414, 431})
#: The status recorded when sending a case raised instead of getting an answer.
NO_ANSWER = 0


def verdict(case: Case, answer: Answer) -> str | None:
    """``None`` when the answer is right, else what is wrong with it."""
    if answer.status == NO_ANSWER:
        return "no answer"
    if answer.status >= 500:
        return "5xx"
    if 200 <= answer.status < 300 and not case.expect.accept:
        return "wrongly accepted"
    if answer.status >= 400 and answer.error_code is None:
        if answer.status in _SERVER_STATUSES and case.server_may_refuse:
            return None
        return f"{answer.status} without a JSON error body"
    if answer.status not in case.expect.statuses:
        return f"status {answer.status}, expected {sorted(case.expect.statuses)}"
    if answer.status >= 400 and case.expect.codes and answer.error_code not in case.expect.codes:
        return f"code {answer.error_code!r}, expected {sorted(case.expect.codes)}"
    return None


def status_label(case: Case, answer: Answer) -> str:
    if answer.status == NO_ANSWER:
        return "no answer"
    if answer.status >= 400 and answer.error_code is None:
        return f"{answer.status} (server)" if case.server_may_refuse else f"{answer.status} (not JSON)"
    return str(answer.status)


@dataclasses.dataclass
class Report:
    """Every answer of one run of cases, and what was wrong with any of them."""

    label: str
    wall_time: float = 0.0
    counts: collections.Counter[tuple[str, str]] = dataclasses.field(default_factory=collections.Counter)
    problems: list[tuple[Case, Answer, str]] = dataclasses.field(default_factory=list)
    #: ``index -> (kind, status, code)``: what two runs of the same cases are compared by.
    answers: dict[int, tuple[str, int, str | None]] = dataclasses.field(default_factory=dict)

    def add(self, case: Case, answer: Answer) -> None:
        self.counts[case.kind, status_label(case, answer)] += 1
        self.answers[case.index] = (case.kind, answer.status, answer.error_code)
        problem = verdict(case, answer)
        if problem is not None:
            self.problems.append((case, answer, problem))

    def count(self, problem: str) -> int:
        return sum(1 for _, _, found in self.problems if found == problem)

    @property
    def server_errors(self) -> int:
        return self.count("5xx")

    @property
    def wrongly_accepted(self) -> int:
        return self.count("wrongly accepted")

    def differences(self, other: Report) -> list[int]:
        """Indexes of cases the two reports answered differently (same seed and count assumed)."""
        return sorted(i for i in self.answers.keys() & other.answers.keys() if self.answers[i] != other.answers[i])

    def describe_problems(self, limit: int = 20) -> str:
        lines = [
            f"#{case.index} {case.kind}: {problem}; {case.request.method} {case.request.target[:200]!r} -> "
            f"{answer.status} {str(answer.body)[:200]}"
            for case, answer, problem in self.problems[:limit]
        ]
        return "\n".join(lines)

    def markdown(self) -> str:
        """Counts per case kind and answer status, then 5xx, wrongly accepted and other problems per kind."""
        kinds = sorted({kind for kind, _ in self.counts})
        statuses = sorted(
            {status for _, status in self.counts}, key=lambda s: (int(s[:3]) if s[:3].isdigit() else 0, s)
        )
        per_kind = collections.Counter(case.kind for case, _, _ in self.problems)
        fives = collections.Counter(case.kind for case, _, p in self.problems if p == "5xx")
        accepted = collections.Counter(case.kind for case, _, p in self.problems if p == "wrongly accepted")
        header = ["case kind", *statuses, "5xx", "wrongly accepted", "other problems"]
        rows = [f"| {' | '.join(header)} |", f"|{'|'.join(['---'] + ['---:'] * (len(header) - 1))}|"]
        for kind in kinds:
            other = per_kind[kind] - fives[kind] - accepted[kind]
            cells = [str(self.counts[kind, status] or "") for status in statuses]
            rows.append(f"| {kind} | {' | '.join(cells)} | {fives[kind]} | {accepted[kind]} | {other} |")
        totals = [str(sum(self.counts[kind, status] for kind in kinds)) for status in statuses]
        other_total = len(self.problems) - self.server_errors - self.wrongly_accepted
        rows.append(
            f"| **all {sum(self.counts.values())}** | {' | '.join(totals)} | {self.server_errors} | "
            f"{self.wrongly_accepted} | {other_total} |"
        )
        return "\n".join(rows)


def run_cases(cases: Sequence[Case], send: Callable[[Case], Answer], report: Report, *, clients: int = 1) -> Report:
    """Send every case (from ``clients`` threads) and add each answer to ``report``."""

    def answer(case: Case) -> Answer:
        try:
            return send(case)
        except Exception as exc:  # one broken exchange must not cost the other answers of a long run
            return Answer(NO_ANSWER, {"error": repr(exc)})

    def answered(batch: Iterable[Case]) -> list[tuple[Case, Answer]]:
        return [(case, answer(case)) for case in batch]

    if clients == 1:
        results = answered(cases)
    else:
        with ThreadPoolExecutor(clients) as pool:
            batches = pool.map(answered, [cases[i::clients] for i in range(clients)])
            results = [pair for batch in batches for pair in batch]
    for case, answer in sorted(results, key=lambda pair: pair[0].index):
        report.add(case, answer)
    return report
