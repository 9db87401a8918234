"""Turn run directories into the paper's tables and figures: Peak / End / Final tables
(`tables`), penalty histories (`penalties`), pattern prevalence (`patterns`), plots (`plots`) and
penalty audits (`audit`). Everything is read back from the run directory; `python -m
dynalize.report` is the command line."""

from .runs import Metric, ReportError, Run, default_metrics, parse_metric
from .tables import axis_table, table1

__all__ = ["Metric", "ReportError", "Run", "axis_table", "default_metrics", "parse_metric", "table1"]
