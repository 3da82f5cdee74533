"""The format probe of docs/experiment.md ("What the nodes learn") on a throwaway model."""

from __future__ import annotations

from node_toys import make_policy

from research.learned import format_report
from sapo_node.tasks import EASY_CATALOGUE


def test_the_report_reads_score_format_and_knowledge_per_dataset():
    model, tokenizer = make_policy("a", seed=0)
    report = format_report(model, tokenizer, n=3, temperature=1.0, max_new_tokens=4)
    assert set(report) == set(EASY_CATALOGUE.datasets)
    for score, tagged, knows in report.values():
        assert 0.0 <= score <= knows <= 1.0 and 0.0 <= tagged <= 1.0
        assert score <= tagged  # a reward needs the tags
