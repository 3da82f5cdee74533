"""What the pool calls: the only moderation functions pool code imports.

- `rollouts_screen` / `rollouts_record`: pool.services.rollout_share, around its INSERT (automatic
  rules, automatic verdicts in the audit log, trust counting, holds). See moderation.screening.
- `sample_keep` / `weighted_pick`: pool.selectors.rollout_sample, on its uniform draws (trust-weighted
  sampling; both return None when weighting is off, and the pool then draws as before).
- `node_message_quota`: pool.consumers.NodeConsumer, when a socket opens (trust-scaled rate limit).
"""

from __future__ import annotations

from moderation.screening import Screening, rollouts_record, rollouts_screen
from moderation.trust import node_message_quota, sample_keep, weighted_pick

__all__ = ["Screening", "node_message_quota", "rollouts_record", "rollouts_screen", "sample_keep", "weighted_pick"]
